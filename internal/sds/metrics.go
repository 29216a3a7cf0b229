package sds

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// requestTypeCSR is the request_type label of CA calls, as Istio's.
const requestTypeCSR = "csr"

// metrics are Istio's secret-manager metrics, with Istio's names.
type metrics struct {
	outgoingLatency     *prometheus.CounterVec
	outgoingRequests    *prometheus.CounterVec
	failedRequests      *prometheus.CounterVec
	retries             *prometheus.CounterVec
	fileWatcherFailures prometheus.Counter
	fileSecretFailures  prometheus.Counter
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
		fileWatcherFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_num_file_watcher_failures_total", Help: "Number of times file watcher failed to add watchers"}),
		fileSecretFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_num_file_secret_failures_total", Help: "Number of times secret generation failed for files"}),
		expiredNonce: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_pilot_xds_expired_nonce", Help: "Total number of XDS requests with an expired nonce."}, []string{"type"}),
		sendTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "istio_agent_pilot_xds_send_time", Help: "Total time in seconds Pilot takes to send generated configuration.",
			Buckets: []float64{.01, .1, 1, 3, 5, 10, 20, 30}}),
	}
	// Istio's counters exist from the start with the csr label.
	for _, v := range []*prometheus.CounterVec{m.outgoingLatency, m.outgoingRequests, m.failedRequests, m.retries} {
		v.WithLabelValues(requestTypeCSR)
	}
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
