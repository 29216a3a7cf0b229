package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/agentd/agentd/internal/envoy"
	"github.com/agentd/agentd/internal/status"
	"github.com/agentd/agentd/internal/supervisor"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// errQuit is why agentd stops after POST /quitquitquit.
var errQuit = errors.New("/quitquitquit called")

// statusRun is agentd's status server and what ties it to agentd's lifetime: it opens before
// the children start, answers 503 on /healthz/ready from the first SIGTERM on, keeps serving
// app probes and metrics while the children drain, and closes once they have stopped.
type statusRun struct {
	srv *status.Server

	mu   sync.Mutex
	quit context.CancelCauseFunc // ends Run's context
}

// newStatus opens the status port (all interfaces, as Istio) and builds the server from
// Istio's env: ISTIO_PROMETHEUS_ANNOTATIONS (sidecars only), PILOT_AGENT_MERGE_ENVOY_STATS
// (true), ENVOY_PROMETHEUS_PORT (15090), METRICS_LOCALHOST_ACCESS_ONLY (false).
func (a *Agent) newStatus() (*statusRun, error) {
	port := cmp.Or(a.opts.StatusPort, defaultStatusPort)
	app, err := status.ParsePrometheusAnnotations(a.opts.getenv("ISTIO_PROMETHEUS_ANNOTATIONS"), port)
	if err != nil {
		return nil, err
	}
	if t := a.opts.Proxy.Type; t != "" && t != "sidecar" {
		app = nil // Istio merges app metrics for sidecars only
	}
	bools, err := envBools(&a.opts, map[string]bool{"PILOT_AGENT_MERGE_ENVOY_STATS": true, "METRICS_LOCALHOST_ACCESS_ONLY": false})
	if err != nil {
		return nil, err
	}
	ints, err := envInts(&a.opts, map[string]int{"ENVOY_PROMETHEUS_PORT": 15090})
	if err != nil {
		return nil, err
	}
	// agentd's own registry shows its Go runtime and process as Istio's agent does.
	wrapped := prometheus.WrapRegistererWithPrefix("istio_agent_", a.metrics)
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := wrapped.Register(c); err != nil && !errors.As(err, &prometheus.AlreadyRegisteredError{}) {
			return nil, fmt.Errorf("status metrics: %w", err)
		}
	}
	run := &statusRun{}
	cfg := status.Config{
		Ready:                a.Ready,
		Registry:             a.metrics,
		Sources:              a.helperMetrics,
		App:                  app,
		MetricsLocalhostOnly: bools["METRICS_LOCALHOST_ACCESS_ONLY"],
		Quit:                 func() { a.envoyDrain.Skip(); run.stop(errQuit) }, // Istio: no drain
		NameTable:            a.nameTable,
		Log:                  a.log.Named("status"),
	}
	if slices.ContainsFunc(a.children, func(c supervisor.Child) bool { return c.Name == "prober" }) {
		// Without a prober (nothing to probe), /app-health/... gets Istio's 400.
		cfg.AppProbes = status.NewProbeForwarder(filepath.Join(a.opts.Root, ProbeSocket), a.log.Named("status"))
	}
	if !a.opts.DisableEnvoy {
		if bools["PILOT_AGENT_MERGE_ENVOY_STATS"] {
			cfg.EnvoyMetricsURL = "http://localhost:" + strconv.Itoa(ints["ENVOY_PROMETHEUS_PORT"]) + "/stats/prometheus"
		}
		_, popts, err := a.envoyConfig()
		if err != nil {
			return nil, fmt.Errorf("status server: %w", err)
		}
		admin := envoy.NewAdmin(popts.AdminHost, popts.AdminPort)
		cfg.Drain = func() {
			a.envoyDrain.Skip() // the coming SIGTERM exits at once, as Istio's
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := admin.DrainListeners(ctx, popts.InboundOnly, true); err != nil {
				a.log.Error("drain Envoy's listeners", "error", err)
			}
		}
	}
	if cfg.Listener, err = net.Listen("tcp", ":"+strconv.Itoa(port)); err != nil {
		return nil, fmt.Errorf("status port: %w", err)
	}
	if run.srv, err = status.New(cfg); err != nil {
		cfg.Listener.Close()
		return nil, err
	}
	return run, nil
}

// quittable returns Run's context, which /quitquitquit can end too.
func (r *statusRun) quittable(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancelCause(ctx)
	r.mu.Lock()
	r.quit = cancel
	r.mu.Unlock()
	return ctx
}

func (r *statusRun) stop(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.quit != nil {
		r.quit(cause)
	}
}

// around runs the status server around the supervisor's run.
func (r *statusRun) around(supervise func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan error, 1)
		go func() {
			err := r.srv.Run(sctx)
			if sctx.Err() == nil { // as Istio, which SIGTERMs itself: stop gracefully
				r.stop(err)
			}
			done <- err
		}()
		stopped := make(chan struct{})
		go func() {
			select {
			case <-ctx.Done():
				r.srv.Terminate(context.Cause(ctx))
			case <-stopped:
			}
		}()
		err := supervise(ctx)
		close(stopped)
		cancel()
		return errors.Join(err, <-done)
	}
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
