package prober

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/agentd/agentd/internal/kubeprobe"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/memory"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// Helper is the prober as an agentd helper: the app probes and the health check, started and
// stopped together.
type Helper struct {
	log      hclog.Logger
	listener net.Listener
	probes   *AppProbes
	health   *HealthCheck // nil without a readinessProbe
	bus      *component.Bus
	serving  atomic.Bool
	server   *Server
	metrics  *metrics
}

func newHelper(cfg *agentv1.ProberConfig, l net.Listener, bus *component.Bus, log hclog.Logger, reg prometheus.Registerer) (*Helper, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	kube, err := kubeprobe.ParseKubeProbes(cfg.GetKubeAppProbers())
	if err != nil {
		return nil, err
	}
	m := newMetrics(reg)
	p := &Helper{log: log, listener: l, bus: bus, metrics: m}
	// A flood of probes (a benchmark, a misconfigured period) leaves the heap at the
	// high-water mark of its garbage: given back a second after it ends.
	burst := &memory.Burst{Min: probeBurst}
	observe := func(kind string, ok bool) {
		m.observeAppProbe(kind, ok)
		burst.Done()
	}
	p.probes = NewAppProbes(AppProbeOptions{
		Probes:          kube,
		PodIP:           cfg.GetPodIp(),
		LegacyLocalhost: cfg.GetLegacyLocalhostDestination(),
		IPv6:            cfg.GetIpv6(),
		StatusPort:      int(cfg.GetStatusPort()),
		DisableHTTP2:    cfg.GetDisableHttp2Probing(),
		KeepAlive:       cfg.GetProbeKeepaliveConnections(),
		Log:             log.Named("probes"),
		Observe:         observe,
	})
	if rp := cfg.GetReadinessProbe(); rp != nil {
		probe := &networking.ReadinessProbe{}
		if err := rp.UnmarshalTo(probe); err != nil {
			return nil, fmt.Errorf("decode readinessProbe: %w", err)
		}
		p.health, err = NewHealthCheck(probe, HealthOptions{
			Host:          healthHost(cfg),
			Source:        p.probes.source,
			AgentReadyURL: cfg.GetAgentReadyUrl(),
		})
		if err != nil {
			return nil, err
		}
	}
	p.server = NewServer(l, p.probes, log)
	return p, nil
}

// probeBurst is how many app probes make a burst after which memory is given back (an hour of
// kubelet's probing at three probes every ten seconds; a moment of a benchmark's).
const probeBurst = 1000

// healthHost is the default host of the health checks: the pod IP, or localhost.
func healthHost(cfg *agentv1.ProberConfig) string {
	if cfg.GetLegacyLocalhostDestination() || cfg.GetPodIp() == "" {
		return "localhost"
	}
	return cfg.GetPodIp()
}

// Handler answers the app probe paths; agentd's status server forwards them here.
func (p *Helper) Handler() http.Handler { return p.probes }

// Run serves the connections agentd hands over on the "probe" socket and runs the health
// check until ctx ends.
func (p *Helper) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		p.serving.Store(true)
		return p.server.Run(ctx)
	})
	if p.health != nil {
		g.Go(func() error { return p.health.Run(ctx, p.log.Named("healthcheck"), p.publish) })
	}
	return g.Wait()
}

// Ready is nil once app probes are served.
func (p *Helper) Ready() error {
	if !p.serving.Load() {
		return errors.New("not serving app probes yet")
	}
	return nil
}

func (p *Helper) publish(ctx context.Context, h *agentv1.WorkloadHealth) error {
	p.metrics.observeHealth(h.GetHealthy())
	if p.bus == nil {
		return nil
	}
	return p.bus.Publish(ctx, agentv1.TopicWorkloadHealth, h)
}

type metrics struct {
	reg       prometheus.Registerer
	appProbes *prometheus.CounterVec
	healthy   prometheus.Gauge
	once      sync.Once // healthy is registered at the first report, so never shows a guess
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		appProbes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentd_app_probes_total",
			Help: "Forwarded kubelet app probes, by probe type (http, tcp, grpc) and result (success, failure).",
		}, []string{"type", "result"}),
		healthy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "istio_agent_workload_healthy",
			Help: "Last WorkloadEntry health check state reported: 1 healthy, 0 unhealthy.",
		}),
	}
	m.reg = reg
	reg.MustRegister(m.appProbes)
	return m
}

func (m *metrics) observeHealth(healthy bool) {
	m.once.Do(func() { m.reg.MustRegister(m.healthy) })
	if healthy {
		m.healthy.Set(1)
	} else {
		m.healthy.Set(0)
	}
}

func (m *metrics) observeAppProbe(kind string, ok bool) {
	result := "failure"
	if ok {
		result = "success"
	}
	m.appProbes.WithLabelValues(kind, result).Inc()
}
