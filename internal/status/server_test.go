package status

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/kubeprobe"
	"github.com/agentd/agentd/internal/testing/logbuf"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/agentd/agentd/internal/prober"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs a status server on addr ("127.0.0.1:0" unless given) and returns its base URL.
func start(t *testing.T, cfg Config, addr string) (*Server, string) {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = l
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return s, "http://127.0.0.1:" + strconv.Itoa(s.Port())
}

func do(t *testing.T, method, url string, hdr http.Header) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if h := hdr.Get("Host"); h != "" {
		req.Host = h
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func TestReadiness(t *testing.T) {
	var reason atomic.Value
	reason.Store("xds-proxy is starting")
	logs := &logbuf.Buffer{}
	s, base := start(t, Config{
		Ready: func(context.Context) error {
			if r := reason.Load().(string); r != "" {
				return errors.New(r)
			}
			return nil
		},
		Log: hclog.New(&hclog.LoggerOptions{Output: logs}),
	}, "")
	steps := []struct {
		reason string
		want   int
		log    string
	}{
		{"xds-proxy is starting", 503, "Envoy proxy is NOT ready: xds-proxy is starting"},
		{"", 200, "Envoy proxy is ready"},
		{"dns-proxy is not ready: no name table yet", 503, "Envoy proxy is NOT ready: dns-proxy is not ready: no name table yet"},
		{"", 200, ""},
	}
	for i, st := range steps {
		reason.Store(st.reason)
		if code, _, _ := do(t, "GET", base+"/healthz/ready", nil); code != st.want {
			t.Errorf("step %d (%q): /healthz/ready = %d, want %d", i, st.reason, code, st.want)
		}
		if st.log != "" && !strings.Contains(logs.String(), st.log) {
			t.Errorf("step %d: log lacks %q:\n%s", i, st.log, logs)
		}
	}
	if n := strings.Count(logs.String(), "Envoy proxy is ready"); n != 2 {
		t.Errorf("logged \"Envoy proxy is ready\" %d times, want 2 (only after a failure)", n)
	}
	s.Terminate(errors.New("SIGTERM"))
	if code, _, _ := do(t, "GET", base+"/healthz/ready", nil); code != 503 {
		t.Errorf("after Terminate: /healthz/ready = %d, want 503", code)
	}
	if !strings.Contains(logs.String(), "server is terminated: SIGTERM") {
		t.Errorf("log lacks the termination reason:\n%s", logs)
	}
}

// externalIP returns a non-loopback IPv4 address of this machine, or "".
func externalIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	return ""
}

func TestLocalOnlyEndpoints(t *testing.T) {
	var quits, drains atomic.Int32
	table := &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
		"svc.ns.svc.cluster.local": {Ips: []string{"10.0.0.1"}, Registry: "Kubernetes", Shortname: "svc", Namespace: "ns",
			AltHosts: []string{"svc.ns"}},
	}}
	s, base := start(t, Config{
		Quit:      func() { quits.Add(1) },
		Drain:     func() { drains.Add(1) },
		NameTable: func() *ndsv1.NameTable { return table },
	}, "0.0.0.0:0")
	remote := ""
	if ip := externalIP(); ip != "" {
		remote = "http://" + net.JoinHostPort(ip, strconv.Itoa(s.Port()))
	}
	tests := []struct {
		method, path string
		remote       bool
		code         int
		body         string
	}{
		{"GET", "/quitquitquit", false, 405, "Method Not Allowed\n"},
		{"GET", "/drain", false, 405, "Method Not Allowed\n"},
		{"POST", "/drain", false, 200, "OK"},
		{"POST", "/quitquitquit", true, 403, "Only requests from localhost are allowed\n"},
		{"POST", "/drain", true, 403, "Only requests from localhost are allowed\n"},
		{"GET", "/debug/ndsz", true, 403, "Only requests from localhost are allowed\n"},
		{"GET", "/debug/pprof/", true, 403, "Only requests from localhost are allowed\n"},
		{"GET", "/debug/pprof/cmdline", false, 200, ""},
		{"POST", "/quitquitquit", false, 200, "OK"},
	}
	for _, tc := range tests {
		url := base + tc.path
		if tc.remote {
			if remote == "" {
				t.Logf("no non-loopback address: skipping remote %s %s", tc.method, tc.path)
				continue
			}
			url = remote + tc.path
		}
		code, body, _ := do(t, tc.method, url, nil)
		if code != tc.code || (tc.body != "" && body != tc.body) {
			t.Errorf("%s %s (remote %v) = %d %q, want %d %q", tc.method, tc.path, tc.remote, code, body, tc.code, tc.body)
		}
	}
	if quits.Load() != 1 || drains.Load() != 1 {
		t.Errorf("Quit called %d times, Drain %d times, want 1 and 1", quits.Load(), drains.Load())
	}
	code, body, _ := do(t, "GET", base+"/debug/ndsz", nil)
	if code != 200 || !strings.Contains(body, `"svc.ns.svc.cluster.local"`) || !strings.Contains(body, `"svc.ns"`) {
		t.Errorf("/debug/ndsz = %d %s, want the table with the alt host expanded", code, body)
	}
}

func TestNoTableNoProbers(t *testing.T) {
	_, base := start(t, Config{DisableProfiling: true}, "")
	tests := []struct {
		path string
		code int
		body string
	}{
		{"/debug/ndsz", 404, "{}"},
		{"/app-health/app/readyz", 400, "app prober config does not exists for /app-health/app/readyz"},
		{"/debug/pprof/", 404, "404 page not found\n"},
		{"/healthz/ready", 200, ""},
	}
	for _, tc := range tests {
		if code, body, _ := do(t, "GET", base+tc.path, nil); code != tc.code || body != tc.body {
			t.Errorf("GET %s = %d %q, want %d %q", tc.path, code, body, tc.code, tc.body)
		}
	}
}

// TestAppProbesThroughProber runs the real prober helper on a Unix socket behind the status
// server's forwarder, as agentd wires them.
func TestAppProbesThroughProber(t *testing.T) {
	var seen sync.Map
	app := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store("host", r.Host)
		seen.Store("x-token", r.Header.Get("X-Token"))
		seen.Store("xff", r.Header.Get("X-Forwarded-For"))
		if r.URL.Path == "/bad" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, "app says "+r.URL.Path)
	})}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Serve(al)
	defer app.Close()
	appPort := al.Addr().(*net.TCPAddr).Port

	// Reserve the status port first: the prober needs to know it.
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	statusPort := sl.Addr().(*net.TCPAddr).Port
	sl.Close()

	sock := filepath.Join(t.TempDir(), "probe.sock")
	pl, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	probes, err := kubeprobe.ParseKubeProbes(fmt.Sprintf(`{
		"/app-health/app/readyz":{"httpGet":{"path":"/ok","port":%d},"timeoutSeconds":1},
		"/app-health/app/livez":{"httpGet":{"path":"/bad","port":%d},"timeoutSeconds":1}}`, appPort, appPort))
	if err != nil {
		t.Fatal(err)
	}
	ps := prober.NewServer(pl, prober.NewAppProbes(prober.AppProbeOptions{Probes: probes, PodIP: "127.0.0.1", StatusPort: statusPort}), nil)
	pctx, pcancel := context.WithCancel(context.Background())
	pdone := make(chan error, 1)
	go func() { pdone <- ps.Run(pctx) }()
	defer func() { pcancel(); <-pdone }()

	_, base := start(t, Config{AppProbes: NewProbeForwarder(sock, nil)}, "127.0.0.1:"+strconv.Itoa(statusPort))
	tests := []struct {
		path, host string
		code       int
		body       string
		wantHost   string
	}{
		{"/app-health/app/readyz", "", 200, "app says /ok", "127.0.0.1:" + strconv.Itoa(appPort)},
		{"/app-health/app/readyz", "pod.example:8443", 200, "app says /ok", "pod.example:8443"},
		{"/app-health/app/livez", "", 503, "app says /bad", ""},
		{"/app-health/other/livez", "", 400, "app prober config does not exists for /app-health/other/livez", ""},
	}
	for _, tc := range tests {
		hdr := http.Header{"X-Token": {"secret"}, "X-Forwarded-For": {"10.9.9.9"}}
		if tc.host != "" {
			hdr.Set("Host", tc.host)
		}
		code, body, _ := do(t, "GET", base+tc.path, hdr)
		if code != tc.code || body != tc.body {
			t.Errorf("GET %s = %d %q, want %d %q", tc.path, code, body, tc.code, tc.body)
		}
		if tc.wantHost == "" {
			continue
		}
		if h, _ := seen.Load("host"); h != tc.wantHost {
			t.Errorf("GET %s Host %q: app saw Host %q, want %q", tc.path, tc.host, h, tc.wantHost)
		}
		if v, _ := seen.Load("x-token"); v != "secret" {
			t.Errorf("app saw X-Token %q, want secret", v)
		}
		if v, _ := seen.Load("xff"); v != "10.9.9.9" {
			t.Errorf("app saw X-Forwarded-For %q, want kubelet's 10.9.9.9 only", v)
		}
	}
}

func TestWait(t *testing.T) {
	var calls atomic.Int32
	srv := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/never":
			w.WriteHeader(http.StatusServiceUnavailable)
		case calls.Add(1) < 3:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Close()
	base := "http://" + l.Addr().String()
	opts := WaitOptions{Timeout: 5 * time.Second, Period: 10 * time.Millisecond, RequestTimeout: time.Second}

	opts.URL = base + "/ready"
	if err := Wait(context.Background(), opts); err != nil {
		t.Errorf("Wait on a server ready at the third poll = %v", err)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("Wait polled %d times, want 3", n)
	}
	opts.URL, opts.Timeout = base+"/never", 200*time.Millisecond
	err = Wait(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), "timeout waiting for Envoy proxy to become ready. Last error: HTTP status code 503") {
		t.Errorf("Wait on a never-ready server = %v, want Istio's timeout error", err)
	}
	opts.URL = "http://" + closedAddr(t)
	if err := Wait(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Wait on a closed port = %v, want the connection error as the last error", err)
	}
}

func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
