package wasm

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values, as Istio's agent exports them.
const (
	fetchSuccess     = "success"
	downloadFailure  = "download_failure"
	manifestFailure  = "manifest_failure"
	checksumMismatch = "checksum_mismatched"
	invalidBinary    = "fetch_failure" // Istio counts an invalid binary under this name

	conversionSuccess   = "success"
	noRemoteLoad        = "no_remote_load"
	marshalFailure      = "marshal_failure"
	unmarshalFailure    = "unmarshal_failure"
	fetchFailure        = "fetch_failure"
	missRemoteFetchHint = "miss_remote_fetch_hint"
)

// Metrics are istio-agent's Wasm metrics, under the names it exports them.
type Metrics struct {
	// Vectors without labels where Istio serves a metric from its first record on only.
	cacheEntries       *prometheus.GaugeVec
	cacheLookups       *prometheus.CounterVec   // hit: "true" or "false"
	remoteFetches      *prometheus.CounterVec   // result
	conversions        *prometheus.CounterVec   // result
	conversionDuration *prometheus.HistogramVec // milliseconds
}

// NewMetrics registers the Wasm metrics with reg (none when reg is nil).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		cacheEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "istio_agent_wasm_cache_entries", Help: "number of Wasm remote fetch cache entries.",
		}, nil),
		cacheLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_wasm_cache_lookup_count", Help: "number of Wasm remote fetch cache lookups.",
		}, []string{"hit"}),
		remoteFetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_wasm_remote_fetch_count",
			Help: "number of Wasm remote fetches and results, including success, download failure, and checksum mismatch.",
		}, []string{"result"}),
		conversions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_wasm_config_conversion_count",
			Help: "number of Wasm config conversions and results, including success, no remote load, marshal failure, remote fetch failure, miss remote fetch hint.",
		}, []string{"result"}),
		conversionDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "istio_agent_wasm_config_conversion_duration",
			Help:    "Total time in milliseconds istio-agent spends on converting remote load in Wasm config.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384},
		}, nil),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.cacheEntries, m.cacheLookups, m.remoteFetches, m.conversions, m.conversionDuration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register wasm metrics: %w", err)
		}
	}
	return m, nil
}
