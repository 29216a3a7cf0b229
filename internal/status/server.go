// Package status is agentd's status server (Istio's port 15020): readiness, the forwarded
// kubelet app probes, merged Prometheus metrics, /quitquitquit, /drain, /debug/ndsz and pprof.
package status

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/protobuf/encoding/protojson"

	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// Config is what the status server needs from agentd. The zero value of each field is its
// default; only Listener is required.
type Config struct {
	// Listener is the status port's socket (15020), opened by agentd.
	Listener net.Listener
	// Ready returns nil when agentd is ready, or the reason it is not (which child, which
	// step). Nil: always ready.
	Ready func(ctx context.Context) error
	// AppProbes answers /app-health/... and /app-lifecycle/...; agentd passes a ProbeForwarder
	// to the prober's socket. Nil: every probe path answers 400, as Istio without probers.
	AppProbes http.Handler
	// Registry holds agentd's own istio_agent_* metrics; the scrape counters are added to it.
	// Nil: a new registry with Istio's Go and process collectors (istio_agent_go_*, ...).
	Registry *prometheus.Registry
	// Sources are the helpers' metrics, merged after agentd's (Prometheus text).
	Sources func(ctx context.Context) []MetricsSource
	// EnvoyMetricsURL is Envoy's Prometheus endpoint, copied after the agent's metrics
	// (http://localhost:15090/stats/prometheus). Empty: no Envoy metrics (Envoy disabled, or
	// PILOT_AGENT_MERGE_ENVOY_STATS=false).
	EnvoyMetricsURL string
	// App is the application's metrics to merge last (ISTIO_PROMETHEUS_ANNOTATIONS, see
	// ParsePrometheusAnnotations). Nil: none.
	App *AppMetrics
	// MetricsLocalhostOnly restricts the metrics pages to loopback clients
	// (METRICS_LOCALHOST_ACCESS_ONLY).
	MetricsLocalhostOnly bool
	// Quit is called after POST /quitquitquit has answered: stop without draining.
	Quit func()
	// Drain is called after POST /drain has answered: drain Envoy now, exit at once later.
	Drain func()
	// NameTable returns the DNS name table for /debug/ndsz, or nil before the first one.
	NameTable func() *ndsv1.NameTable
	// DisableProfiling leaves out /debug/pprof (pilot-agent --profiling=false).
	DisableProfiling bool
	// Log is the status server's logger.
	Log hclog.Logger
	// MaxConns caps the status port's open connections (default DefaultMaxConns() of the fd
	// limit at each new connection).
	MaxConns int
}

// Server is the status server.
type Server struct {
	cfg     Config
	log     hclog.Logger
	metrics *scrapeMetrics
	http    *http.Server
	client  *http.Client // for Envoy's and the app's metrics
	conns   *connLimit

	mu         sync.Mutex
	terminated error // set by Terminate: readiness fails at once with it
	lastReady  bool
}

// New builds the status server.
func New(cfg Config) (*Server, error) {
	if cfg.Listener == nil {
		return nil, errors.New("status server: no listener")
	}
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
		wrapped := prometheus.WrapRegistererWithPrefix("istio_agent_", cfg.Registry)
		wrapped.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m, err := newScrapeMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Log, metrics: m, client: &http.Client{Transport: &http.Transport{Proxy: nil}}}
	s.conns = newConnLimit(cfg.MaxConns)
	// Every connection is bounded in time and in number: idle ones, slow readers and slow
	// writers end, and a flood of them cannot take the file descriptors agentd needs to
	// restart its children and serve its control socket.
	s.http = &http.Server{
		Handler:           writeDeadline(s.Handler()),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		IdleTimeout:       idleTimeout,
		ConnState:         s.conns.track,
	}
	return s, nil
}

// writeDeadline bounds the time to write each answer, but pprof's: a profile takes as long
// as it is asked to (http.Server's WriteTimeout would refuse a long one).
func writeDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/debug/pprof/") {
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeTimeout))
		}
		h.ServeHTTP(w, r)
	})
}

// Port is the status port the listener is on.
func (s *Server) Port() int {
	if a, ok := s.cfg.Listener.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Handler is the status server's mux.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz/ready", s.handleReady)
	mux.HandleFunc("/stats/prometheus", s.handleStats)
	mux.HandleFunc("/metrics", s.handleStats)
	mux.HandleFunc("/quitquitquit", localPost(s.handleQuit))
	mux.HandleFunc("/drain", localPost(s.handleDrain))
	mux.HandleFunc("/app-health/", s.handleAppProbe)
	mux.HandleFunc("/app-lifecycle/", s.handleAppProbe)
	mux.HandleFunc("/debug/ndsz", localOnly(s.handleNdsz))
	if !s.cfg.DisableProfiling {
		mux.HandleFunc("/debug/pprof/", localOnly(pprof.Index))
		mux.HandleFunc("/debug/pprof/cmdline", localOnly(pprof.Cmdline))
		mux.HandleFunc("/debug/pprof/profile", localOnly(pprof.Profile))
		mux.HandleFunc("/debug/pprof/symbol", localOnly(pprof.Symbol))
		mux.HandleFunc("/debug/pprof/trace", localOnly(pprof.Trace))
	}
	return mux
}

// Run serves until ctx ends. Unlike Istio's, agentd keeps the status port open while it
// drains (readiness says 503, app probes still answer): cancel ctx only when the children
// have stopped.
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("status server listening", "address", s.cfg.Listener.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(s.cfg.Listener) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve status port: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.http.Shutdown(sctx); err != nil {
		s.http.Close()
	}
	<-errc
	return nil
}

// Terminate makes readiness fail at once with "server is terminated: <cause>", as Istio's does
// from SIGTERM on; everything else keeps answering.
func (s *Server) Terminate(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.terminated == nil {
		s.terminated = cause
	}
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	err := s.ready(r.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		s.log.Warn("Envoy proxy is NOT ready: " + err.Error())
		s.lastReady = false
		return
	}
	w.WriteHeader(http.StatusOK)
	if !s.lastReady {
		s.log.Info("Envoy proxy is ready")
	}
	s.lastReady = true
}

func (s *Server) ready(ctx context.Context) error {
	s.mu.Lock()
	terminated := s.terminated
	s.mu.Unlock()
	if terminated != nil {
		return fmt.Errorf("server is terminated: %v", terminated)
	}
	if s.cfg.Ready == nil {
		return nil
	}
	return s.cfg.Ready(ctx)
}

func (s *Server) handleQuit(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("OK"))
	s.log.Info("handling /quitquitquit, notifying agentd to exit")
	if s.cfg.Quit != nil {
		s.cfg.Quit()
	}
}

func (s *Server) handleDrain(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("OK"))
	s.log.Info("handling /drain, starting drain")
	if s.cfg.Drain != nil {
		s.cfg.Drain()
	}
}

func (s *Server) handleAppProbe(w http.ResponseWriter, r *http.Request) {
	if s.cfg.AppProbes == nil {
		s.log.Error("prober does not exist", "path", r.URL.Path)
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, "app prober config does not exists for %v", r.URL.Path)
		return
	}
	s.cfg.AppProbes.ServeHTTP(w, r)
}

func (s *Server) handleNdsz(w http.ResponseWriter, _ *http.Request) {
	var table *ndsv1.NameTable
	if s.cfg.NameTable != nil {
		table = s.cfg.NameTable()
	}
	if table == nil {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{}`))
		return
	}
	b, err := protojson.Marshal(expandAltHosts(table))
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(err.Error()))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// expandAltHosts adds each Kubernetes entry's deprecated alt hosts as entries of their own,
// as Istio's /debug/ndsz shows the table.
func expandAltHosts(t *ndsv1.NameTable) *ndsv1.NameTable {
	out := &ndsv1.NameTable{Table: make(map[string]*ndsv1.NameTable_NameInfo, len(t.GetTable()))}
	for host, info := range t.GetTable() {
		out.Table[host] = info
		if info.GetRegistry() != "Kubernetes" {
			continue
		}
		for _, alt := range info.GetAltHosts() { //nolint:staticcheck // Istio still serves them
			if _, ok := out.Table[alt]; !ok {
				out.Table[alt] = &ndsv1.NameTable_NameInfo{Ips: info.GetIps(), Registry: "Kubernetes"}
			}
		}
	}
	return out
}

// isLocal reports whether the request comes from a loopback address.
func isLocal(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func localOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !isLocal(r) {
			http.Error(w, "Only requests from localhost are allowed", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}

func localPost(h http.HandlerFunc) http.HandlerFunc {
	return localOnly(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
			return
		}
		h(w, r)
	})
}
