package settings

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestParseProxyCommand(t *testing.T) {
	tests := []struct {
		name    string
		args    string
		typ     string
		want    ProxyFlags
		unknown int
		level   hclog.Level
	}{
		{"injection template", "sidecar --domain $(POD_NAMESPACE).svc.cluster.local --proxyLogLevel=warning --proxyComponentLogLevel=misc:error --log_output_level=default:info",
			"sidecar", ProxyFlags{Type: "sidecar", Domain: "$(POD_NAMESPACE).svc.cluster.local", LogLevel: "warning", ComponentLogLevel: "misc:error"}, 0, hclog.Info},
		{"gateway with concurrency and json logs", "router --domain ns.svc.cluster.local --proxyLogLevel=warning --log_output_level=default:warning --log_as_json --concurrency 2",
			"router", ProxyFlags{Type: "router", Domain: "ns.svc.cluster.local", LogLevel: "warning", Concurrency: 2, LogAsJSON: true}, 0, hclog.Warn},
		{"VM install (istio-start.sh)", "--serviceCluster=rawvm --stsPort 15463",
			"", ProxyFlags{ServiceCluster: "rawvm", StsPort: 15463}, 0, hclog.Info},
		{"profiling off", "sidecar --profiling=false", "sidecar", ProxyFlags{Type: "sidecar", DisableProfiling: true}, 0, hclog.Info},
		{"old templates' unknown flags", "sidecar --configPath /etc/istio/proxy --binaryPath /usr/local/bin/envoy --trust-domain=cluster.local --controlPlaneBootstrap=false --drainDuration 45s --templateFile=/t.json",
			"sidecar", ProxyFlags{Type: "sidecar", TemplateFile: "/t.json"}, 5, hclog.Info},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParseProxyCommand(strings.Fields(tt.args))
			if err != nil {
				t.Fatal(err)
			}
			if p.Flags.Proxy != tt.want {
				t.Errorf("ParseProxyCommand(%q) = %+v, want %+v", tt.args, p.Flags.Proxy, tt.want)
			}
			if len(p.Unknown) != tt.unknown {
				t.Errorf("unknown flags = %v, want %d", p.Unknown, tt.unknown)
			}
			if got := p.LogLevel; got != tt.level {
				t.Errorf("log level = %v, want %v", got, tt.level)
			}
		})
	}
	for _, bad := range []string{"sidecar --concurrency two", "sidecar router", "sidecar --domain"} {
		if _, err := ParseProxyCommand(strings.Fields(bad)); err == nil {
			t.Errorf("ParseProxyCommand(%q) accepted it", bad)
		}
	}
}
