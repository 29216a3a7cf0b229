package xdsproxy

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are istio-agent's xDS proxy metrics, under the names it exports them.
type metrics struct {
	requests, responses prometheus.Counter
	upstreamFailures    prometheus.Counter
	// By how streams ended: type "cancelled" (an expected end) or "error".
	upstreamEnds, downstreamEnds *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_xds_proxy_requests", Help: "The total number of Xds Proxy Requests",
		}),
		responses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_xds_proxy_responses", Help: "The total number of Xds Proxy Responses",
		}),
		upstreamFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_istiod_connection_failures", Help: "The total number of connection failures to Istiod",
		}),
		upstreamEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_istiod_connection_terminations", Help: "The total number of connection errors to Istiod",
		}, []string{"type"}),
		downstreamEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_envoy_connection_terminations", Help: "The total number of connection errors from envoy",
		}, []string{"type"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.responses, m.upstreamFailures, m.upstreamEnds, m.downstreamEnds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register xds-proxy metrics: %w", err)
		}
	}
	return m, nil
}
