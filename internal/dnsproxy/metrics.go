package dnsproxy

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are Istio's DNS proxy metrics, under the names Istio's agent exports them.
type metrics struct {
	requests         prometheus.Counter
	upstreamRequests prometheus.Counter
	upstreamFailures prometheus.Counter
	upstreamDuration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_dns_requests_total",
			Help: "Total number of DNS requests.",
		}),
		upstreamRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_dns_upstream_requests_total",
			Help: "Total number of DNS requests forwarded to upstream.",
		}),
		upstreamFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_dns_upstream_failures_total",
			Help: "Total number of DNS requests that no upstream answered.",
		}),
		upstreamDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "istio_agent_dns_upstream_request_duration_seconds",
			Help:    "Total time in seconds Istio takes to get DNS response from upstream.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.1, 1, 5},
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.upstreamRequests, m.upstreamFailures, m.upstreamDuration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register dns metrics: %w", err)
		}
	}
	return m, nil
}
