package agent

import (
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Options are agentd's settings, from `agentd run`'s flags and environment (read in main
// only). The zero value of each field is its default unless its comment says otherwise.
type Options struct {
	// Root is where Istio's relative paths live (etc/istio/proxy, var/run/secrets, ...).
	Root string
	// HelpersDir holds the helper binaries (xds-proxy, sds-server, dns-proxy, prober).
	HelpersDir string
	// DisableEnvoy runs without Envoy (proxyless gRPC, DNS only). Istio: DISABLE_ENVOY.
	DisableEnvoy bool
	// EnvoyBinary is Envoy's path (Istio's ProxyConfig binaryPath).
	EnvoyBinary string
	// DiscoveryAddress is the upstream xDS server (ProxyConfig discoveryAddress).
	DiscoveryAddress string
	// DNSAddress is where dns-proxy listens, UDP and TCP (Istio: DNS_PROXY_ADDR, default
	// localhost:15053: 127.0.0.1 and/or ::1 by the resolv.conf's nameserver families).
	DNSAddress string
	// ResolvConf holds dns-proxy's upstream nameservers and search list (default
	// /etc/resolv.conf).
	ResolvConf string
	// StatusPort is the status server's port (ProxyConfig statusPort).
	StatusPort int
	// Env is the environment agentd was started with, as os.Environ returns it; the helpers'
	// Istio settings are read from it.
	Env []string
	// Proxy is pilot-agent's `proxy` command line, for Envoy (see envoy.go).
	Proxy ProxyArgs
	// Log is agentd's logger; each child's lines appear under it with the child's name.
	Log hclog.Logger

	// Timeouts of the supervisor (zero: supervisor.Default...).
	ReadyTimeout, DrainTimeout, StopTimeout time.Duration
}

// getenv returns the value of key in Options.Env.
func (o *Options) getenv(key string) string {
	for i := len(o.Env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(o.Env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}
