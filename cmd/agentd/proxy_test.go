package main

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestParseProxyFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    string
		typ     string
		strs    map[string]string
		ints    map[string]int
		unknown int
		level   hclog.Level
	}{
		{"injection template", "sidecar --domain $(POD_NAMESPACE).svc.cluster.local --proxyLogLevel=warning --proxyComponentLogLevel=misc:error --log_output_level=default:info",
			"sidecar", map[string]string{"domain": "$(POD_NAMESPACE).svc.cluster.local", "proxyLogLevel": "warning", "proxyComponentLogLevel": "misc:error"}, nil, 0, hclog.Info},
		{"gateway with concurrency and json logs", "router --domain ns.svc.cluster.local --proxyLogLevel=warning --log_output_level=default:warning --log_as_json --concurrency 2",
			"router", map[string]string{"domain": "ns.svc.cluster.local"}, map[string]int{"concurrency": 2}, 0, hclog.Warn},
		{"VM install (istio-start.sh)", "--serviceCluster=rawvm --stsPort 15463",
			"", map[string]string{"serviceCluster": "rawvm"}, map[string]int{"stsPort": 15463}, 0, hclog.Info},
		{"old templates' unknown flags", "sidecar --configPath /etc/istio/proxy --binaryPath /usr/local/bin/envoy --trust-domain=cluster.local --controlPlaneBootstrap=false --drainDuration 45s --templateFile=/t.json",
			"sidecar", map[string]string{"templateFile": "/t.json"}, nil, 5, hclog.Info},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parseProxyFlags(strings.Fields(tt.args))
			if err != nil {
				t.Fatal(err)
			}
			if p.typ != tt.typ {
				t.Errorf("type = %q, want %q", p.typ, tt.typ)
			}
			for k, v := range tt.strs {
				if p.strings[k] != v {
					t.Errorf("--%s = %q, want %q", k, p.strings[k], v)
				}
			}
			for k, v := range tt.ints {
				if p.ints[k] != v {
					t.Errorf("--%s = %d, want %d", k, p.ints[k], v)
				}
			}
			if len(p.unknown) != tt.unknown {
				t.Errorf("unknown flags = %v, want %d", p.unknown, tt.unknown)
			}
			if got := p.logLevel(); got != tt.level {
				t.Errorf("log level = %v, want %v", got, tt.level)
			}
		})
	}
	for _, bad := range []string{"sidecar --concurrency two", "sidecar router", "sidecar --domain"} {
		if _, err := parseProxyFlags(strings.Fields(bad)); err == nil {
			t.Errorf("parseProxyFlags(%q) accepted it", bad)
		}
	}
}
