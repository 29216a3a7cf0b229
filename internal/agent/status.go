package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/agentd/agentd/internal/envoy"
	"github.com/agentd/agentd/internal/envoy/bootstrap"
	"github.com/agentd/agentd/internal/settings"
	"github.com/agentd/agentd/internal/status"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// statusConfig is the status server's configuration without its hooks into the running
// agentd: the app metrics to merge (ISTIO_PROMETHEUS_ANNOTATIONS, sidecars only), Envoy's
// metrics (PILOT_AGENT_MERGE_ENVOY_STATS, ENVOY_PROMETHEUS_PORT),
// METRICS_LOCALHOST_ACCESS_ONLY and --profiling.
func statusConfig(s *settings.Settings) (status.Config, error) {
	app, err := status.ParsePrometheusAnnotations(s.Env.PrometheusAnnotations, s.StatusPort)
	if err != nil {
		return status.Config{}, err
	}
	if s.ProxyType != bootstrap.Sidecar {
		app = nil // Istio merges app metrics for sidecars only
	}
	cfg := status.Config{App: app, MetricsLocalhostOnly: s.Env.MetricsLocalhostOnly, DisableProfiling: s.Proxy.DisableProfiling}
	if !s.DisableEnvoy && s.Env.MergeEnvoyStats {
		cfg.EnvoyMetricsURL = "http://localhost:" + strconv.Itoa(int(s.Env.EnvoyPrometheusPort)) + "/stats/prometheus"
	}
	return cfg, nil
}

// newStatus opens the status port (all interfaces, as Istio) and builds the server with its
// hooks into agentd: readiness, the helpers' metrics, /quitquitquit and /drain, the probes.
func (a *Agent) newStatus() (*status.Server, error) {
	cfg, err := statusConfig(a.s)
	if err != nil {
		return nil, fmt.Errorf("status server: %w", err)
	}
	// agentd's own registry shows its Go runtime and process as Istio's agent does.
	wrapped := prometheus.WrapRegistererWithPrefix("istio_agent_", a.metrics)
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := wrapped.Register(c); err != nil && !errors.As(err, &prometheus.AlreadyRegisteredError{}) {
			return nil, fmt.Errorf("status metrics: %w", err)
		}
	}
	cfg.Ready, cfg.Registry, cfg.Sources, cfg.NameTable = a.Ready, a.metrics, a.helperMetrics, a.nameTable
	cfg.Log = a.log.Named("status")
	cfg.Quit = func() { a.envoyDrain.Skip(); a.Stop(errQuit) } // Istio: no drain
	if a.cfg.prober != nil {
		// Without a prober (nothing to probe), /app-health/... gets Istio's 400.
		cfg.AppProbes = status.NewProbeForwarder(filepath.Join(a.s.Root, ProbeSocket), cfg.Log)
	}
	if a.cfg.envoy != nil {
		admin := envoy.NewAdmin(a.cfg.envoyRun.AdminHost, a.cfg.envoyRun.AdminPort)
		inboundOnly := a.cfg.envoyRun.InboundOnly
		cfg.Drain = func() {
			a.envoyDrain.Skip() // the coming SIGTERM exits at once, as Istio's
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := admin.DrainListeners(ctx, inboundOnly, true); err != nil {
				a.log.Error("drain Envoy's listeners", "error", err)
			}
		}
	}
	if cfg.Listener, err = net.Listen("tcp", ":"+strconv.Itoa(a.s.StatusPort)); err != nil {
		return nil, fmt.Errorf("status port: %w", err)
	}
	srv, err := status.New(cfg)
	if err != nil {
		cfg.Listener.Close()
		return nil, err
	}
	return srv, nil
}

// runStatus serves the status port until ctx (cancelled once the supervisor has returned)
// ends. When run (Run's context) ends, readiness turns 503 at once, with run's cause; a
// status server that fails on its own stops agentd gracefully, as Istio's agent, which
// SIGTERMs itself.
func (a *Agent) runStatus(ctx, run context.Context, srv *status.Server) error {
	if srv == nil { // status port 0
		return nil
	}
	stopped := context.AfterFunc(run, func() { srv.Terminate(context.Cause(run)) })
	defer stopped()
	err := srv.Run(ctx)
	if err != nil && ctx.Err() == nil {
		a.Stop(fmt.Errorf("%w: %w", errStatusFailed, err))
	}
	return err
}

// helperMetrics are the helpers' metrics for the status server; Envoy's come from its
// Prometheus port instead.
func (a *Agent) helperMetrics(ctx context.Context) []status.MetricsSource {
	texts, errs := a.sup.Metrics(ctx)
	var out []status.MetricsSource
	for name, text := range texts {
		if name != "envoy" {
			out = append(out, status.MetricsSource{Name: name, Fetch: func(context.Context) ([]byte, error) { return text, nil }})
		}
	}
	for name, err := range errs {
		if name != "envoy" {
			out = append(out, status.MetricsSource{Name: name, Fetch: func(context.Context) ([]byte, error) { return nil, err }})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// nameTable is the retained name table on the bus, for /debug/ndsz.
func (a *Agent) nameTable() *ndsv1.NameTable {
	m := a.bus.Retained(agentv1.TopicNameTable)
	if m == nil {
		return nil
	}
	t := &ndsv1.NameTable{}
	if err := m.GetPayload().UnmarshalTo(t); err != nil {
		return nil
	}
	return t
}
