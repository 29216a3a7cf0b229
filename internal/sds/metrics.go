package sds

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// requestTypeCSR is the request_type label of CA calls, as Istio's.
const requestTypeCSR = "csr"

// metrics are Istio's secret-manager metrics, with Istio's names.
type metrics struct {
	outgoingLatency  *prometheus.CounterVec
	outgoingRequests *prometheus.CounterVec
	failedRequests   *prometheus.CounterVec
	retries          *prometheus.CounterVec
	// Without labels, but vectors: Istio serves them from their first failure on, as a
	// vector serves its series from its first use.
	fileWatcherFailures *prometheus.CounterVec
	fileSecretFailures  *prometheus.CounterVec
	// Istio's xDS-server metrics, which its agent's SDS server counts: requests with a nonce
	// older than the last response's (label type "sds"), and how long each response took to
	// send, in seconds.
	expiredNonce *prometheus.CounterVec
	sendTime     prometheus.Histogram
}

// metricTypeSDS is Istio's type label of SDS in its xDS metrics.
const metricTypeSDS = "sds"

// newMetrics registers the metrics on reg (none when reg is nil). expiry reports the workload
// certificate's expiry time (zero when there is none).
func newMetrics(reg prometheus.Registerer, expiry func() time.Time) *metrics {
	byType := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_agent_" + name, Help: help}, []string{"request_type"})
	}
	m := &metrics{
		outgoingLatency:  byType("outgoing_latency", "The latency of outgoing requests (e.g. to a token exchange server, CA, etc.) in milliseconds."),
		outgoingRequests: byType("num_outgoing_requests", "Number of total outgoing requests (e.g. to a token exchange server, CA, etc.)"),
		failedRequests:   byType("num_failed_outgoing_requests", "Number of failed outgoing requests (e.g. to a token exchange server, CA, etc.)"),
		retries:          byType("num_outgoing_retries", "Number of outgoing retry requests (e.g. to a token exchange server, CA, etc.)"),
		fileWatcherFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_num_file_watcher_failures_total", Help: "Number of times file watcher failed to add watchers"}, nil),
		fileSecretFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_num_file_secret_failures_total", Help: "Number of times secret generation failed for files"}, nil),
		expiredNonce: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_pilot_xds_expired_nonce", Help: "Total number of XDS requests with an expired nonce."}, []string{"type"}),
		sendTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "istio_agent_pilot_xds_send_time", Help: "Total time in seconds Pilot takes to send generated configuration.",
			Buckets: []float64{.01, .1, 1, 3, 5, 10, 20, 30}}),
	}
	// As pilot-agent's status port shows them after a start (test/compat
	// TestProbesAsPilotAgent): the CA call counters with the csr label, and the expired SDS
	// nonces with type sds (Istio's SDS server pushes again as it generates the first
	// secrets, and the acknowledgement of its first answer then carries an old nonce; agentd
	// answers once, so the series is made here, at 0). Failures and retries show from the
	// first one.
	for _, v := range []*prometheus.CounterVec{m.outgoingLatency, m.outgoingRequests} {
		v.WithLabelValues(requestTypeCSR)
	}
	m.expiredNonce.WithLabelValues(metricTypeSDS)
	if reg == nil {
		return m
	}
	expirySeconds := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "istio_agent_cert_expiry_seconds",
		Help:        "The left time, in seconds, when cert chain will expire. A negative value indicates the cert is expired.",
		ConstLabels: prometheus.Labels{"resource_name": ResourceDefault},
	}, func() float64 {
		t := expiry()
		if t.IsZero() {
			return 0
		}
		return time.Until(t).Seconds()
	})
	reg.MustRegister(m.outgoingLatency, m.outgoingRequests, m.failedRequests, m.retries,
		m.fileWatcherFailures, m.fileSecretFailures, expirySeconds, m.expiredNonce, m.sendTime)
	return m
}
