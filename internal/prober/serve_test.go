package prober

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/kubeprobe"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// TestAnswersAsNetHTTP: the prober answers kubelet's requests on a handed connection as
// net/http's server answers them with the same handler, whether its own loop answers them
// (kubelet's GETs) or net/http's server behind it (HTTP/1.0, a body, Expect, bad requests):
// status, header fields (Date aside), body, and whether the connection stays open.
func TestAnswersAsNetHTTP(t *testing.T) {
	prober, direct := startBothServers(t)
	get := func(path, extra string) string {
		return "GET " + path + " HTTP/1.1\r\nHost: 10.1.2.3:15020\r\nUser-Agent: kube-probe/1.33\r\n" + extra + "\r\n"
	}
	tests := []struct {
		name     string
		requests []string // written together, answered in order
	}{
		{"probes one after the other", []string{get("/app-health/ok/readyz", ""), get("/app-health/json/readyz", ""), get("/app-health/html/readyz", "")}},
		{"gzip", []string{get("/app-health/html/readyz", "Accept-Encoding: gzip\r\n"), get("/app-health/ok/readyz", "Accept-Encoding: gzip\r\n")}},
		{"no content", []string{get("/app-health/empty/readyz", "")}},
		{"no such probe", []string{get("/app-health/none/readyz", "")}},
		{"HEAD", []string{"HEAD /app-health/ok/readyz HTTP/1.1\r\nHost: x\r\n\r\n"}},
		{"connection close", []string{get("/app-health/ok/readyz", "Connection: close\r\n")}},
		{"HTTP/1.0", []string{"GET /app-health/ok/readyz HTTP/1.0\r\n\r\n"}},
		{"HTTP/1.0 keep-alive", []string{"GET /app-health/ok/readyz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", get("/app-health/ok/readyz", "")}},
		{"a body", []string{"POST /app-health/ok/readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", get("/app-health/ok/readyz", "")}},
		{"expect", []string{get("/app-health/ok/readyz", "Expect: 100-continue\r\n")}},
		{"missing host", []string{"GET /app-health/ok/readyz HTTP/1.1\r\n\r\n"}},
		{"bad host", []string{"GET /app-health/ok/readyz HTTP/1.1\r\nHost: a b\r\n\r\n"}},
		{"not HTTP", []string{"hello\r\n\r\n"}},
		// What follows a first request is read by the prober's own loop, not by the status
		// server that handed the connection over.
		{"not HTTP after a probe", []string{get("/app-health/ok/readyz", ""), "hello\r\n\r\n"}},
		{"unknown transfer coding after a probe", []string{get("/app-health/ok/readyz", ""),
			"POST /app-health/ok/readyz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"}},
		{"HTTP/2 after a probe", []string{get("/app-health/ok/readyz", ""), "GET /app-health/ok/readyz HTTP/2.0\r\nHost: x\r\n\r\n"}},
		{"another path after a probe", []string{get("/app-health/ok/readyz", ""), get("/healthz/ready", "")}},
		{"invalid header name after a probe", []string{get("/app-health/ok/readyz", ""), get("/app-health/json/readyz", "Accept-En oding: gzip\r\n")}},
		{"two Host fields after a probe", []string{get("/app-health/ok/readyz", ""), get("/app-health/ok/readyz", "Host: y\r\n")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := exchange(t, direct, tc.requests, 10*time.Second)
			got := exchange(t, prober, tc.requests, 10*time.Second)
			if got != want {
				t.Errorf("through the prober:\n%s\nnet/http's server:\n%s", got, want)
			}
		})
	}
}

// exchange writes requests on a new connection to addr and describes the answers: status,
// header fields but Date, body, and "closed" when the server closed the connection after them.
func exchange(t testing.TB, addr string, requests []string, timeout time.Duration) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(conn, strings.Join(requests, "")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	var b strings.Builder
	for _, r := range requests {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(r)))
		if err != nil {
			req = &http.Request{Method: http.MethodGet}
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			b.WriteString(readError(err) + "\n")
			break
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Header.Del("Date")
		if resp.Header.Get("Content-Encoding") == "gzip" {
			body = []byte(fmt.Sprintf("(%d gzipped bytes)", len(body)))
		}
		fmt.Fprintf(&b, "%s %q body %q length %d\n", resp.Status, resp.Header, body, resp.ContentLength)
		if resp.Close {
			break
		}
	}
	// A server that keeps the connection sends nothing more; one that closes it has by now.
	_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := br.ReadByte(); err == io.EOF {
		b.WriteString("closed\n")
	}
	return b.String()
}

// readError describes a failed read of an answer without the connection's addresses.
func readError(err error) string {
	var (
		ne net.Error
		oe *net.OpError
	)
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "no answer"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed"
	case errors.As(err, &oe):
		return "error " + oe.Err.Error()
	}
	return "error " + err.Error()
}

// FuzzAnswersAsNetHTTP: whatever follows kubelet's first probe on a handed connection (read
// by the prober's own loop) is answered as net/http's server answers it.
func FuzzAnswersAsNetHTTP(f *testing.F) {
	prober, direct := startBothServers(f)
	probe := "GET /app-health/ok/readyz HTTP/1.1\r\nHost: 10.1.2.3:15020\r\n\r\n"
	for _, seed := range []string{
		probe, "HEAD /app-health/ok/readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"GET /app-health/json/readyz HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n",
		"GET /app-health/ok/readyz HTTP/1.0\r\n\r\n", "GET /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /app-health/ok/readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
		"GET /app-health/ok/readyz HTTP/1.1\r\nHost: a b\r\n\r\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, next string) {
		requests := []string{probe, next}
		// An unfinished request gets no answer from either within the timeout.
		if want, got := exchange(t, direct, requests, 3*time.Second), exchange(t, prober, requests, 3*time.Second); got != want {
			t.Errorf("after a probe, %q:\nthrough the prober:\n%s\nnet/http's server:\n%s", next, got, want)
		}
	})
}

// startBothServers starts an app and the prober behind a status server, as in
// startProberAt, and net/http's server with the prober's handler: their addresses.
func startBothServers(t testing.TB) (prober, direct string) {
	app := startApp(t, false, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			fmt.Fprint(w, "fine")
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"ready":false}`)
		case "/html":
			fmt.Fprint(w, "<html><body>"+strings.Repeat("x", 1500)+"</body></html>")
		}
	})
	probes := map[string]string{}
	for _, p := range []string{"ok", "empty", "json", "html"} {
		probes["/app-health/"+p+"/readyz"] = fmt.Sprintf(`{"httpGet":{"path":"/%s","port":%d},"timeoutSeconds":1}`, p, app.port)
	}
	cfg := &agentv1.ProberConfig{PodIp: "127.0.0.1", StatusPort: 15020, KubeAppProbers: probesJSON(probes)}
	_, _, prober = startProberAt(t, cfg)
	kube, err := kubeprobe.ParseKubeProbes(cfg.KubeAppProbers)
	if err != nil {
		t.Fatal(err)
	}
	// Probe paths to the prober's handler, as the prober routes them once it has a
	// connection (no ServeMux's path cleaning), the others as startProberAt's front (a
	// ServeMux) answers what the prober hands back.
	probeHandler := NewAppProbes(AppProbeOptions{Probes: kube, PodIP: "127.0.0.1", StatusPort: 15020})
	front := http.NewServeMux()
	front.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "status server %s", r.URL.Path) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isProbePath(r.URL.Path) {
			probeHandler.ServeHTTP(w, r)
			return
		}
		front.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return prober, srv.Listener.Addr().String()
}
