package agent

import (
	"testing"

	"github.com/agentd/agentd/internal/settings"
)

// TestStatusPortFromProxyConfig: a ProxyConfig statusPort (PROXY_CONFIG, or the
// status.sidecar.istio.io/port annotation) moves the status server, and the prober probes and
// checks readiness on the same port.
func TestStatusPortFromProxyConfig(t *testing.T) {
	s := resolve(t, settings.Flags{}, `PROXY_CONFIG={"statusPort":15030,"readinessProbe":{"tcpSocket":{"port":8080}}}`, probers[0])
	if s.StatusPort != 15030 {
		t.Errorf("status port = %d, want 15030", s.StatusPort)
	}
	p, err := proberConfig(s)
	if err != nil {
		t.Fatal(err)
	}
	if p.GetStatusPort() != 15030 || p.GetAgentReadyUrl() != "http://127.0.0.1:15030/healthz/ready" {
		t.Errorf("prober status port %d, ready URL %q, want 15030's", p.GetStatusPort(), p.GetAgentReadyUrl())
	}
	if got := bootstrapConfig(s).ProxyConfig.GetStatusPort(); got != 15030 {
		t.Errorf("Envoy's ProxyConfig statusPort = %d, want 15030", got)
	}
}

// TestDomainReachesDNSProxy: `proxy sidecar --domain` is the DNS proxy's domain too.
func TestDomainReachesDNSProxy(t *testing.T) {
	s := resolve(t, settings.Flags{Proxy: settings.ProxyFlags{Domain: "ns1.svc.example.org"}}, dnsOn...)
	cfg, _, _, err := dnsProxyConfig(s, 0)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GetProxyDomain() != "ns1.svc.example.org" {
		t.Errorf("dns-proxy's domain = %q, want --domain's", cfg.GetProxyDomain())
	}
}

// TestProfilingOff: `proxy sidecar --profiling=false` leaves /debug/pprof out.
func TestProfilingOff(t *testing.T) {
	p, err := settings.ParseProxyCommand([]string{"sidecar", "--profiling=false"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := statusConfig(resolve(t, p.Flags))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.DisableProfiling {
		t.Error("status server with --profiling=false: profiling on")
	}
}

// TestRunAndProxyResolveAlike: `agentd run` and `agentd proxy` give the same Settings for the
// same environment: both go through the table (DISABLE_ENVOY, DNS_PROXY_ADDR, ...).
func TestRunAndProxyResolveAlike(t *testing.T) {
	root := t.TempDir()
	env := []string{"DISABLE_ENVOY=true", "DNS_PROXY_ADDR=127.0.0.1:5353", "ISTIO_META_DNS_CAPTURE=true"}
	p, err := settings.ParseProxyCommand([]string{"sidecar", "--root", root})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*settings.Settings{resolve(t, settings.Flags{Root: root}, env...), resolve(t, p.Flags, env...)} {
		if !s.DisableEnvoy || s.DNSAddress != "127.0.0.1:5353" {
			t.Errorf("DisableEnvoy %v, DNSAddress %q: want DISABLE_ENVOY's and DNS_PROXY_ADDR's", s.DisableEnvoy, s.DNSAddress)
		}
	}
}
