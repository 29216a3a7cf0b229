package prober

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/kubeprobe"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/agentd/agentd/internal/status"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

func TestMain(m *testing.M) {
	if os.Getenv(benchAppEnv) != "" {
		benchAppMain()
		return
	}
	goleak.VerifyTestMain(m)
}

// app is a real HTTP application on 127.0.0.1 that records what it received.
type app struct {
	srv  *httptest.Server
	port int
	mu   sync.Mutex
	reqs []*http.Request // clones of every request received
}

func (a *app) received() []*http.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*http.Request(nil), a.reqs...)
}

func startApp(t testing.TB, tls bool, h http.HandlerFunc) *app {
	t.Helper()
	return startAppOn(t, "127.0.0.1:0", tls, h)
}

func startAppOn(t testing.TB, addr string, tls bool, h http.HandlerFunc) *app {
	t.Helper()
	a := &app{}
	a.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.reqs = append(a.reqs, r.Clone(context.Background()))
		a.mu.Unlock()
		h(w, r)
	}))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	a.srv.Listener.Close()
	a.srv.Listener = l
	if tls {
		a.srv.EnableHTTP2 = true
		a.srv.StartTLS()
	} else {
		a.srv.Start()
	}
	t.Cleanup(a.srv.Close)
	a.port = a.srv.Listener.Addr().(*net.TCPAddr).Port
	return a
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// startProber runs the prober on a temp Unix socket behind agentd's probe forwarder on a
// loopback port, and returns a client that talks to that port, as kubelet to the status port.
func startProber(t *testing.T, cfg *agentv1.ProberConfig) (*http.Client, *prometheus.Registry) {
	c, reg, _ := startProberAt(t, cfg)
	return c, reg
}

// startProberAt is startProber that also returns the front's address. The front is the
// status server's routing: app probe paths to the forwarder, others answered by the front
// ("status server PATH").
func startProberAt(t testing.TB, cfg *agentv1.ProberConfig) (*http.Client, *prometheus.Registry, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "probe.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p, err := newHelper(cfg, l, nil, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	mux := http.NewServeMux()
	mux.Handle("/app-health/", status.NewProbeForwarder(sock, nil))
	mux.Handle("/app-lifecycle/", status.NewProbeForwarder(sock, nil))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "status server %s", r.URL.Path) })
	front := httptest.NewServer(mux)
	t.Cleanup(front.Close)
	addr := front.Listener.Addr().String()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}, reg, addr
}

type answer struct {
	code int
	body string
}

func get(t *testing.T, c *http.Client, path string, hdr http.Header, host string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://status"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if host != "" {
		req.Host = host
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, string(b)}
}

func probesJSON(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, strconv.Quote(k)+":"+v)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func TestHTTPProbes(t *testing.T) {
	other := startAppOn(t, "127.0.0.2:0", false, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "other host") })
	otherURL := "http://127.0.0.2:" + strconv.Itoa(other.port) + "/"
	plain := startApp(t, false, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			fmt.Fprint(w, "fine")
		case "/fail":
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, "down")
		case "/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		case "/big":
			fmt.Fprint(w, strings.Repeat("x", 20<<10))
		case "/redirect-same":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/redirect-other":
			http.Redirect(w, r, otherURL, http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		}
	})
	secure := startApp(t, true, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls %s", r.Proto)
	})
	refused := freePort(t)

	httpGet := func(port int, path, scheme string) string {
		return fmt.Sprintf(`{"httpGet":{"path":%q,"port":%d,"scheme":%q},"timeoutSeconds":1}`, path, port, scheme)
	}
	cfg := &agentv1.ProberConfig{
		PodIp:      "127.0.0.1",
		StatusPort: 15020,
		KubeAppProbers: probesJSON(map[string]string{
			"/app-health/ok/readyz":             httpGet(plain.port, "/ok", "HTTP"),
			"/app-health/noslash/readyz":        httpGet(plain.port, "ok", ""),
			"/app-health/fail/livez":            httpGet(plain.port, "/fail", "HTTP"),
			"/app-health/slow/livez":            httpGet(plain.port, "/slow", "HTTP"),
			"/app-health/big/livez":             httpGet(plain.port, "/big", "HTTP"),
			"/app-health/refused/livez":         httpGet(refused, "/", "HTTP"),
			"/app-health/same/startupz":         httpGet(plain.port, "/redirect-same", "HTTP"),
			"/app-health/other/startupz":        httpGet(plain.port, "/redirect-other", "HTTP"),
			"/app-health/loop/startupz":         httpGet(plain.port, "/loop", "HTTP"),
			"/app-health/tls/readyz":            httpGet(secure.port, "/", "HTTPS"),
			"/app-lifecycle/ok/prestopz":        httpGet(plain.port, "/ok", "HTTP"),
			"/app-health/tls-nosecure/readyz":   httpGet(secure.port, "/", "HTTP"),
			"/app-health/notimeout/readyz":      fmt.Sprintf(`{"httpGet":{"path":"/ok","port":%d}}`, plain.port),
			"/app-health/ignored-host/readyz":   fmt.Sprintf(`{"httpGet":{"path":"/ok","port":%d,"host":"127.0.0.2"}}`, other.port),
			"/app-health/ignored-host/startupz": fmt.Sprintf(`{"tcpSocket":{"port":%d,"host":"127.0.0.2"}}`, other.port),
		}),
	}
	c, reg := startProber(t, cfg)

	tests := []struct {
		path string
		want answer
	}{
		{"/app-health/ok/readyz", answer{200, "fine"}},
		{"/app-health/noslash/readyz", answer{200, "fine"}},
		{"/app-health/fail/livez", answer{503, "down"}},
		{"/app-health/slow/livez", answer{500, ""}},
		{"/app-health/big/livez", answer{200, strings.Repeat("x", 10<<10)}},
		{"/app-health/refused/livez", answer{500, ""}},
		{"/app-health/same/startupz", answer{200, "fine"}},
		{"/app-health/other/startupz", answer{200, ""}},
		{"/app-health/loop/startupz", answer{500, ""}},
		{"/app-health/tls/readyz", answer{200, "tls HTTP/2.0"}},
		{"/app-health/tls-nosecure/readyz", answer{400, "Client sent an HTTP request to an HTTPS server.\n"}},
		{"/app-lifecycle/ok/prestopz", answer{200, "fine"}},
		{"/app-health/notimeout/readyz", answer{200, "fine"}},
		// The probe's host is never used: the probe goes to the pod, where nothing listens
		// on the other app's port.
		{"/app-health/ignored-host/readyz", answer{500, ""}},
		{"/app-health/ignored-host/startupz", answer{500, ""}},
		{"/app-health/unknown/readyz", answer{400, "app prober config does not exists for /app-health/unknown/readyz"}},
		{"/healthz/ready", answer{200, "status server /healthz/ready"}},
	}
	for _, tc := range tests {
		t.Run(strings.TrimPrefix(tc.path, "/"), func(t *testing.T) {
			if got := get(t, c, tc.path, nil, ""); got != tc.want {
				t.Errorf("GET %s = %d %.60q, want %d %.60q", tc.path, got.code, got.body, tc.want.code, tc.want.body)
			}
		})
	}
	if n := len(other.received()); n != 0 {
		t.Errorf("the other host received %d requests, want 0", n)
	}
	for _, r := range append(plain.received(), secure.received()...) {
		if host, _, _ := net.SplitHostPort(r.RemoteAddr); host != "127.0.0.6" {
			t.Errorf("app saw a probe from %s, want source 127.0.0.6", r.RemoteAddr)
		}
	}
	if got := counterValue(t, reg, "agentd_app_probes_total", map[string]string{"type": "http", "result": "failure"}); got < 4 {
		t.Errorf("agentd_app_probes_total{http,failure} = %v, want at least 4", got)
	}
}

func TestHTTPProbeHeaders(t *testing.T) {
	a := startApp(t, false, func(w http.ResponseWriter, r *http.Request) {})
	cfg := &agentv1.ProberConfig{
		PodIp:          "127.0.0.1",
		StatusPort:     15020,
		KubeAppProbers: fmt.Sprintf(`{"/app-health/app/readyz":{"httpGet":{"path":"/r","port":%d},"timeoutSeconds":1}}`, a.port),
	}
	c, _ := startProber(t, cfg)
	tests := []struct {
		name     string
		host     string
		wantHost string
	}{
		{"status port replaced by app port", "10.1.2.3:15020", "10.1.2.3:" + strconv.Itoa(a.port)},
		{"other port kept", "example.com:8080", "example.com:8080"},
		{"no port kept", "example.com", "example.com"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := len(a.received())
			hdr := http.Header{"X-Custom": {"a", "b"}, "User-Agent": {"kube-probe/1.30"}}
			if got := get(t, c, "/app-health/app/readyz", hdr, tc.host); got.code != 200 {
				t.Fatalf("probe = %d, want 200", got.code)
			}
			r := a.received()[n]
			if r.Host != tc.wantHost {
				t.Errorf("app saw Host %q, want %q", r.Host, tc.wantHost)
			}
			if got := r.Header.Values("X-Custom"); len(got) != 2 || got[0] != "a" || got[1] != "b" {
				t.Errorf("app saw X-Custom %q, want [a b]", got)
			}
			if got := r.Header.Get("User-Agent"); got != "kube-probe/1.30" {
				t.Errorf("app saw User-Agent %q, want kube-probe/1.30", got)
			}
		})
	}
}

func TestTCPAndGRPCProbes(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	accepted := make(chan string, 10)
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			accepted <- c.RemoteAddr().String()
			c.Close()
		}
	}()

	serving := startGRPC(t, true, healthpb.HealthCheckResponse_SERVING)
	notServing := startGRPC(t, true, healthpb.HealthCheckResponse_NOT_SERVING)
	noHealth := startGRPC(t, false, 0)
	refused := freePort(t)
	grpcProbe := func(port int, service string) string {
		return fmt.Sprintf(`{"grpc":{"port":%d,"service":%q},"timeoutSeconds":1}`, port, service)
	}
	cfg := &agentv1.ProberConfig{
		PodIp: "127.0.0.1",
		KubeAppProbers: probesJSON(map[string]string{
			"/app-health/tcp/livez":          fmt.Sprintf(`{"tcpSocket":{"port":%d},"timeoutSeconds":1}`, tcp.Addr().(*net.TCPAddr).Port),
			"/app-health/tcp-refused/livez":  fmt.Sprintf(`{"tcpSocket":{"port":%d},"timeoutSeconds":1}`, refused),
			"/app-health/grpc/readyz":        grpcProbe(serving, ""),
			"/app-health/grpc-svc/readyz":    grpcProbe(serving, "missing.Service"),
			"/app-health/grpc-down/readyz":   grpcProbe(notServing, ""),
			"/app-health/grpc-nohc/readyz":   grpcProbe(noHealth, ""),
			"/app-health/grpc-refused/livez": grpcProbe(refused, ""),
		}),
	}
	c, _ := startProber(t, cfg)
	tests := []struct {
		path string
		want int
	}{
		{"/app-health/tcp/livez", 200},
		{"/app-health/tcp-refused/livez", 500},
		{"/app-health/grpc/readyz", 200},
		{"/app-health/grpc-svc/readyz", 500},
		{"/app-health/grpc-down/readyz", 500},
		{"/app-health/grpc-nohc/readyz", 500},
		{"/app-health/grpc-refused/livez", 500},
	}
	for _, tc := range tests {
		t.Run(strings.TrimPrefix(tc.path, "/"), func(t *testing.T) {
			if got := get(t, c, tc.path, nil, ""); got.code != tc.want {
				t.Errorf("GET %s = %d, want %d", tc.path, got.code, tc.want)
			}
		})
	}
	select {
	case from := <-accepted:
		if host, _, _ := net.SplitHostPort(from); host != "127.0.0.6" {
			t.Errorf("tcp probe came from %s, want 127.0.0.6", from)
		}
	default:
		t.Error("the tcp app accepted no connection")
	}
}

// startGRPC serves gRPC on 127.0.0.1, with the health service in state st when withHealth.
func startGRPC(t *testing.T, withHealth bool, st healthpb.HealthCheckResponse_ServingStatus) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	if withHealth {
		hs := health.NewServer()
		hs.SetServingStatus("", st)
		healthpb.RegisterHealthServer(s, hs)
	}
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return l.Addr().(*net.TCPAddr).Port
}

func TestParseKubeProbes(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string
		want    int
	}{
		{"empty", "", "", 0},
		{"valid", `{"/app-health/a/livez":{"httpGet":{"port":80}},"/app-lifecycle/a/poststartz":{"tcpSocket":{"port":81}},"/app-health/b/readyz":{"grpc":{"port":82}}}`, "", 3},
		{"malformed json", `{"/app-health/a/livez":`, "failed to decode app prober", 0},
		{"wrong type", `[1,2]`, "failed to decode app prober", 0},
		{"bad path", `{"/app-health/a/alive":{"httpGet":{"port":80}}}`, "invalid path", 0},
		{"nested container", `{"/app-health/a/b/livez":{"httpGet":{"port":80}}}`, "invalid path", 0},
		{"no kind", `{"/app-health/a/livez":{"timeoutSeconds":1}}`, "must be one of type httpGet, tcpSocket or gRPC", 0},
		{"two kinds", `{"/app-health/a/livez":{"httpGet":{"port":80},"tcpSocket":{"port":80}}}`, "must be one of type httpGet, tcpSocket or gRPC", 0},
		{"named http port", `{"/app-health/a/livez":{"httpGet":{"port":"http"}}}`, "the port must be int type", 0},
		{"named tcp port", `{"/app-health/a/livez":{"tcpSocket":{"port":"tcp"}}}`, "the port must be int type", 0},
		{"null probe", `{"/app-health/a/livez":null}`, "null", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := kubeprobe.ParseKubeProbes(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("kubeprobe.ParseKubeProbes(%q) error = %v, want one containing %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("kubeprobe.ParseKubeProbes(%q) = %v", tc.in, err)
			}
			if len(got) != tc.want {
				t.Errorf("kubeprobe.ParseKubeProbes(%q) has %d probes, want %d", tc.in, len(got), tc.want)
			}
		})
	}
}

func TestMalformedConfigFailsStart(t *testing.T) {
	_, err := newHelper(&agentv1.ProberConfig{KubeAppProbers: "{not json"}, nil, nil, nil, prometheus.NewRegistry())
	if err == nil || !strings.Contains(err.Error(), "failed to decode app prober") {
		t.Fatalf("newHelper with malformed ISTIO_KUBE_APP_PROBERS = %v, want a decode error", err)
	}
}

func counterValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestHandedConnection: kubelet's connection, handed to the prober, keeps serving: requests
// one after the other and pipelined, app probes answered by the prober, another path handed
// back to the status server, and an app probe after that forwarded again.
// A connection still open, idle, when the prober stops does not hold it up (startProberAt's
// cleanup fails the test when Run returns an error, as after 5 s of answers under way).
func TestHandedConnection(t *testing.T) {
	app := startApp(t, false, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "fine") })
	var idle net.Conn
	t.Cleanup(func() {
		if idle != nil {
			idle.Close()
		}
	})
	_, _, addr := startProberAt(t, &agentv1.ProberConfig{PodIp: "127.0.0.1", KubeAppProbers: probesJSON(map[string]string{
		"/app-health/ok/readyz": fmt.Sprintf(`{"httpGet":{"path":"/ok","port":%d},"timeoutSeconds":1}`, app.port),
	})})
	req := func(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1:15020\r\n\r\n" }
	probe, other := req("/app-health/ok/readyz"), req("/healthz/ready")
	var err error
	if idle, err = net.Dial("tcp", addr); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(idle, probe); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(bufio.NewReader(idle), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("probe on the connection left idle: %v, %v", resp, err)
	}
	tests := []struct {
		name   string
		writes []string // each written after the answers to the one before were read
		want   []string // bodies, in order
	}{
		{"one after the other", []string{probe, probe, other, probe}, []string{"fine", "fine", "status server /healthz/ready", "fine"}},
		{"pipelined", []string{probe + probe + other + probe}, []string{"fine", "fine", "status server /healthz/ready", "fine"}},
		{"other path first", []string{other, probe, other}, []string{"status server /healthz/ready", "fine", "status server /healthz/ready"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			br := bufio.NewReader(conn)
			var got []string
			for _, w := range tc.writes {
				if _, err := io.WriteString(conn, w); err != nil {
					t.Fatal(err)
				}
				for range strings.Count(w, "GET ") {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatalf("answer %d: %v", len(got)+1, err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					got = append(got, string(b))
				}
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("answers %q, want %q", got, tc.want)
			}
		})
	}
}

// TestProbeAnswerGzip: an app probe's answer of 1 KiB or more goes gzipped to a client that
// accepts gzip, as Istio's status port (gzhttp) sends it; smaller ones and other clients get it
// plain.
func TestProbeAnswerGzip(t *testing.T) {
	app := startApp(t, false, func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		fmt.Fprint(w, strings.Repeat("x", n))
	})
	probe := func(n int) string {
		return fmt.Sprintf(`{"httpGet":{"path":"/?n=%d","port":%d},"timeoutSeconds":1}`, n, app.port)
	}
	c, _ := startProber(t, &agentv1.ProberConfig{PodIp: "127.0.0.1", KubeAppProbers: probesJSON(map[string]string{
		"/app-health/big/readyz":   probe(20000), // passed back cut to 10 KiB
		"/app-health/kib/readyz":   probe(1024),
		"/app-health/small/readyz": probe(1023),
	})})
	tests := []struct {
		path, accept string
		wantGzip     bool
		wantLen      int
	}{
		{"/app-health/big/readyz", "gzip", true, 10 << 10},
		{"/app-health/big/readyz", "", false, 10 << 10},
		{"/app-health/big/readyz", "gzip;q=0", false, 10 << 10},
		{"/app-health/kib/readyz", "gzip, deflate", true, 1024},
		{"/app-health/small/readyz", "gzip", false, 1023},
	}
	for _, tc := range tests {
		req, err := http.NewRequest(http.MethodGet, "http://status"+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("User-Agent", "kube-probe/1.33")
		if tc.accept != "" {
			req.Header.Set("Accept-Encoding", tc.accept) // set by hand: the client does not decompress
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		gz := resp.Header.Get("Content-Encoding") == "gzip"
		if gz {
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if body, err = io.ReadAll(zr); err != nil {
				t.Fatal(err)
			}
		}
		if resp.StatusCode != 200 || gz != tc.wantGzip || len(body) != tc.wantLen {
			t.Errorf("GET %s, Accept-Encoding %q: %d, gzipped %v, %d bytes; want 200, gzipped %v, %d bytes",
				tc.path, tc.accept, resp.StatusCode, gz, len(body), tc.wantGzip, tc.wantLen)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
			t.Errorf("GET %s, Accept-Encoding %q: Content-Type %q, want text/plain; charset=utf-8", tc.path, tc.accept, ct)
		}
	}
}

// TestGRPCProbeClosedPort: a gRPC probe of a port nothing listens on fails after the probe's
// timeoutSeconds, as Istio's blocking dial does, not at once.
func TestGRPCProbeClosedPort(t *testing.T) {
	c, _ := startProber(t, &agentv1.ProberConfig{PodIp: "127.0.0.1", KubeAppProbers: probesJSON(map[string]string{
		"/app-health/grpc-closed/readyz": fmt.Sprintf(`{"grpc":{"port":%d},"timeoutSeconds":1}`, freePort(t)),
	})})
	start := time.Now()
	got := get(t, c, "/app-health/grpc-closed/readyz", nil, "")
	elapsed := time.Since(start)
	if got.code != 500 {
		t.Errorf("status %d, want 500", got.code)
	}
	if elapsed < time.Second {
		t.Errorf("answered after %v, before the probe's 1 s timeout", elapsed)
	}
}
