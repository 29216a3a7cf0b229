package xdsproxy

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"
)

// metrics are istio-agent's xDS proxy metrics, under the names it exports them.
type metrics struct {
	requests, responses prometheus.Counter
	upstreamFailures    *prometheus.CounterVec // no labels: served from the first failure, as Istio
	// By how streams ended: type "cancelled" (an expected end) or "error".
	upstreamEnds, downstreamEnds *prometheus.CounterVec
	// recvMax is the largest message received from a client so far, as Istio's agent
	// measures it on its downstream server (istio_agent_pilot_xds_recv_max).
	recvMax *recvMax
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_xds_proxy_requests", Help: "The total number of Xds Proxy Requests",
		}),
		responses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_xds_proxy_responses", Help: "The total number of Xds Proxy Responses",
		}),
		upstreamFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_istiod_connection_failures", Help: "The total number of connection failures to Istiod",
		}, nil),
		upstreamEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_istiod_connection_terminations", Help: "The total number of connection errors to Istiod",
		}, []string{"type"}),
		downstreamEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_envoy_connection_terminations", Help: "The total number of connection errors from envoy",
		}, []string{"type"}),
		recvMax: &recvMax{gauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "istio_agent_pilot_xds_recv_max", Help: "The maximum size request we have received so far.",
		})},
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.responses, m.upstreamFailures, m.upstreamEnds, m.downstreamEnds, m.recvMax.gauge} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register xds-proxy metrics: %w", err)
		}
	}
	return m, nil
}

// recvMax is a gRPC stats handler that keeps the size of the largest message received (after
// decompression), and sets its gauge each time that grows. Istio's agent puts the same
// handler on its downstream server: the gauge shows how close clients come to the 4 MiB
// receive limit.
type recvMax struct {
	gauge prometheus.Gauge

	mu  sync.Mutex // requests are few: a lock keeps the gauge at the maximum
	max int
}

func (r *recvMax) HandleRPC(_ context.Context, s stats.RPCStats) {
	in, ok := s.(*stats.InPayload)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if in.Length > r.max {
		r.max = in.Length
		r.gauge.Set(float64(in.Length))
	}
}

func (r *recvMax) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (r *recvMax) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (r *recvMax) HandleConn(context.Context, stats.ConnStats)                       {}
