// Package wasm fetches the remote Wasm modules of ECDS filters (OCI images and HTTP(S) URLs),
// verifies and caches them on disk, and rewrites the filters to load the cached file, as
// Istio's agent does before Envoy sees them.
package wasm

import (
	"net/netip"
	"time"
)

// Istio's defaults (pkg/wasm/options.go, pilot/pkg/features).
const (
	DefaultDir                   = "var/lib/istio/data" // Istio's /var/lib/istio/data, under agentd's root
	DefaultPurgeInterval         = time.Hour
	DefaultModuleExpiry          = 24 * time.Hour
	DefaultHTTPRequestTimeout    = 15 * time.Second
	DefaultHTTPRequestMaxRetries = 5
	DefaultMaxBinarySize         = 256 << 20
	// defaultPullTimeout bounds a whole pull when the filter gives no http_uri timeout
	// (istiod always sets 30 s).
	defaultPullTimeout = 5 * time.Second
)

// Options configure the cache. The zero value is Istio's defaults.
type Options struct {
	// Dir holds the modules (default DefaultDir, relative to the working directory).
	Dir string
	// PurgeInterval is how often modules unused for ModuleExpiry are removed
	// (WASM_PURGE_INTERVAL, default 1h; WASM_MODULE_EXPIRY, default 24h).
	PurgeInterval, ModuleExpiry time.Duration
	// InsecureRegistries may be reached over plain HTTP or with an unverified certificate
	// (WASM_INSECURE_REGISTRIES; "*" allows every registry).
	InsecureRegistries []string
	// HTTPRequestTimeout bounds each HTTP(S) request and HTTPRequestMaxRetries counts its
	// attempts (WASM_HTTP_REQUEST_TIMEOUT, default 15s; WASM_HTTP_REQUEST_MAX_RETRIES, 5).
	HTTPRequestTimeout    time.Duration
	HTTPRequestMaxRetries int
	// MaxBinarySize refuses larger modules (ISTIO_WASM_MAX_BINARY_SIZE_BYTES, 256 MiB).
	MaxBinarySize int64
	// BlockedCIDRs are refused as fetch targets, besides the link-local and cloud metadata
	// addresses that always are (BLOCKED_CIDRS_IN_WASM_FETCH).
	BlockedCIDRs []netip.Prefix
}

// withDefaults fills the zero fields with Istio's defaults.
func (o Options) withDefaults() Options {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	def(&o.PurgeInterval, DefaultPurgeInterval)
	def(&o.ModuleExpiry, DefaultModuleExpiry)
	def(&o.HTTPRequestTimeout, DefaultHTTPRequestTimeout)
	if o.HTTPRequestMaxRetries <= 0 {
		o.HTTPRequestMaxRetries = DefaultHTTPRequestMaxRetries
	}
	if o.MaxBinarySize <= 0 {
		o.MaxBinarySize = DefaultMaxBinarySize
	}
	return o
}

// insecure reports whether host may be reached without a verified TLS connection.
func (o Options) insecure(host string) bool {
	for _, r := range o.InsecureRegistries {
		if r == "*" || r == host {
			return true
		}
	}
	return false
}

// PullPolicy is Istio's ISTIO_META_WASM_IMAGE_PULL_POLICY.
type PullPolicy int

// Istio's pull policies; the default behaves as IfNotPresent except for OCI ":latest" tags.
const (
	PullDefault PullPolicy = iota
	PullIfNotPresent
	PullAlways
)

var pullPolicies = map[string]PullPolicy{
	"UNSPECIFIED_POLICY": PullDefault,
	"IfNotPresent":       PullIfNotPresent,
	"Always":             PullAlways,
}

// GetOptions say how one module is wanted.
type GetOptions struct {
	// Checksum is the expected sha256 in hex: of the binary for HTTP(S), of the image
	// manifest for OCI. Empty: not checked.
	Checksum string
	// ResourceName and ResourceVersion identify the WasmPlugin, for the pull policy.
	ResourceName, ResourceVersion string
	// Timeout bounds the whole fetch.
	Timeout    time.Duration
	PullSecret []byte // a dockerconfigjson; nil: the default keychain
	PullPolicy PullPolicy
}
