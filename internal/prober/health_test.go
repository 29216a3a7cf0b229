package prober

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	networking "istio.io/api/networking/v1alpha3"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

func TestThresholds(t *testing.T) {
	fail := errors.New("boom")
	tests := []struct {
		name             string
		success, failure int
		results          []error
		want             []string // "healthy" / "unhealthy: msg" at each step that reports, "" otherwise
	}{
		{"first success reports", 1, 1, []error{nil, nil}, []string{"healthy", ""}},
		{"first failure reports", 1, 1, []error{fail, fail}, []string{"unhealthy: boom", ""}},
		{"flip each way once", 1, 1, []error{nil, fail, fail, nil, nil}, []string{"healthy", "unhealthy: boom", "", "healthy", ""}},
		{"failure threshold 3", 1, 3, []error{nil, fail, fail, nil, fail, fail, fail}, []string{"healthy", "", "", "", "", "", "unhealthy: boom"}},
		{"success threshold 2", 2, 1, []error{nil, fail, nil, nil, nil}, []string{"", "unhealthy: boom", "", "healthy", ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			th := &thresholds{success: tc.success, failure: tc.failure}
			for i, r := range tc.results {
				got := describe(th.observe(r))
				if got != tc.want[i] {
					t.Errorf("step %d: observe(%v) = %q, want %q", i, r, got, tc.want[i])
				}
			}
		})
	}
}

func describe(h *agentv1.WorkloadHealth) string {
	switch {
	case h == nil:
		return ""
	case h.GetHealthy():
		return "healthy"
	default:
		return "unhealthy: " + h.GetMessage()
	}
}

// runCheck runs h with a short period and returns the published events.
func runCheck(t *testing.T, h *HealthCheck) (<-chan *agentv1.WorkloadHealth, func()) {
	t.Helper()
	h.Period = 20 * time.Millisecond
	events := make(chan *agentv1.WorkloadHealth, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- h.Run(ctx, hclog.NewNullLogger(), func(_ context.Context, e *agentv1.WorkloadHealth) error {
			events <- e
			return nil
		})
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return events, stop
}

func next(t *testing.T, events <-chan *agentv1.WorkloadHealth) *agentv1.WorkloadHealth {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no health event within 10s")
		return nil
	}
}

func TestHealthCheckHTTPFlip(t *testing.T) {
	var healthy atomic.Bool
	a := startApp(t, false, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" || r.Header.Get("X-Probe") != "1" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		if !healthy.Load() {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	cfg := &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_HttpGet{HttpGet: &networking.HTTPHealthCheckConfig{
		Path: "/health", Port: uint32(a.port), Scheme: "HTTP",
		HttpHeaders: []*networking.HTTPHeader{{Name: "X-Probe", Value: "1"}},
	}}}
	h, err := NewHealthCheck(cfg, HealthOptions{Host: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if h.Timeout != time.Second || h.SuccessThreshold != 1 || h.FailureThreshold != 1 {
		t.Errorf("defaults: timeout %v thresholds %d/%d, want 1s 1/1", h.Timeout, h.SuccessThreshold, h.FailureThreshold)
	}
	events, _ := runCheck(t, h)
	if e := next(t, events); e.GetHealthy() || !strings.Contains(e.GetMessage(), "bad code 500") {
		t.Fatalf("first event = %v, want unhealthy with bad code 500", e)
	}
	healthy.Store(true)
	if e := next(t, events); !e.GetHealthy() {
		t.Fatalf("second event = %v, want healthy", e)
	}
	healthy.Store(false)
	if e := next(t, events); e.GetHealthy() {
		t.Fatalf("third event = %v, want unhealthy", e)
	}
	for _, r := range a.received() {
		if ua := r.Header.Get("User-Agent"); ua != healthUserAgent {
			t.Errorf("health check User-Agent = %q, want %q", ua, healthUserAgent)
		}
		if host, _, _ := net.SplitHostPort(r.RemoteAddr); host != "127.0.0.6" {
			t.Errorf("health check came from %s, want 127.0.0.6", r.RemoteAddr)
		}
	}
}

func TestHealthCheckKinds(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	serving := startGRPC(t, true, healthpb.HealthCheckResponse_SERVING)
	notServing := startGRPC(t, true, healthpb.HealthCheckResponse_NOT_SERVING)
	refused := freePort(t)
	var notReady atomic.Bool
	notReady.Store(true)
	agent := startApp(t, false, func(w http.ResponseWriter, r *http.Request) {
		if notReady.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	agentURL := agent.srv.URL + "/healthz/ready"

	tests := []struct {
		name    string
		probe   *networking.ReadinessProbe
		agent   string
		healthy bool
		msg     string
	}{
		{"tcp up", tcpCheck(tcp.Addr().(*net.TCPAddr).Port), "", true, ""},
		{"tcp refused", tcpCheck(refused), "", false, "connection refused"},
		{"grpc serving", grpcCheck(serving), "", true, ""},
		{"grpc not serving", grpcCheck(notServing), "", false, "NOT_SERVING"},
		{"exec true", execCheck("true"), "", true, ""},
		{"exec false", execCheck("false"), "", false, "exit status 1"},
		{"exec timeout", execCheck("sleep", "5"), "", false, "command timeout exceeded"},
		{"agent not ready first", tcpCheck(tcp.Addr().(*net.TCPAddr).Port), agentURL, false, "answered 503"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := NewHealthCheck(tc.probe, HealthOptions{Host: "127.0.0.1", AgentReadyURL: tc.agent})
			if err != nil {
				t.Fatal(err)
			}
			events, stop := runCheck(t, h)
			e := next(t, events)
			stop()
			if e.GetHealthy() != tc.healthy || !strings.Contains(e.GetMessage(), tc.msg) {
				t.Errorf("event = %v, want healthy=%v with message containing %q", e, tc.healthy, tc.msg)
			}
		})
	}
}

func tcpCheck(port int) *networking.ReadinessProbe {
	return &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_TcpSocket{
		TcpSocket: &networking.TCPHealthCheckConfig{Port: uint32(port)}}}
}

func grpcCheck(port int) *networking.ReadinessProbe {
	return &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_Grpc{
		Grpc: &networking.GrpcHealthCheckConfig{Port: uint32(port)}}}
}

func execCheck(cmd ...string) *networking.ReadinessProbe {
	return &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_Exec{
		Exec: &networking.ExecHealthCheckConfig{Command: cmd}}}
}

func TestNewHealthCheckErrors(t *testing.T) {
	tests := []struct {
		name  string
		probe *networking.ReadinessProbe
		want  string
	}{
		{"no method", &networking.ReadinessProbe{PeriodSeconds: 3}, "no httpGet, tcpSocket, grpc or exec"},
		{"empty exec", execCheck(), "empty command"},
	}
	for _, tc := range tests {
		if _, err := NewHealthCheck(tc.probe, HealthOptions{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewHealthCheck = %v, want error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestHealthCheckRetriesPublish(t *testing.T) {
	h := &HealthCheck{Period: 10 * time.Millisecond, Timeout: time.Second, SuccessThreshold: 1, FailureThreshold: 1,
		Probe: func(context.Context) error { return nil }}
	var calls atomic.Int32
	published := make(chan *agentv1.WorkloadHealth, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- h.Run(ctx, hclog.NewNullLogger(), func(_ context.Context, e *agentv1.WorkloadHealth) error {
			if calls.Add(1) < 3 {
				return errors.New("bus down")
			}
			published <- e
			return nil
		})
	}()
	e := <-published
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !e.GetHealthy() || calls.Load() != 3 {
		t.Errorf("published %v after %d calls, want healthy after 3", e, calls.Load())
	}
}
