package agent

import (
	"strings"
	"testing"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/agentd/agentd/internal/settings"
)

func TestProberConfig(t *testing.T) {
	tests := []struct {
		name    string
		env     []string
		envoy   bool
		wantErr string
		wantOff bool // nothing to probe: no prober
	}{
		{name: "nothing to probe", env: []string{"INSTANCE_IP=10.1.2.3", `ISTIO_KUBE_APP_PROBERS={}`}, wantOff: true},
		{name: "malformed ISTIO_KUBE_APP_PROBERS", env: []string{`ISTIO_KUBE_APP_PROBERS={"/app-health/a/livez":`},
			wantErr: "ISTIO_KUBE_APP_PROBERS: failed to decode app prober"},
		{name: "bad probe path", env: []string{`ISTIO_KUBE_APP_PROBERS={"/healthz":{"httpGet":{"port":80}}}`},
			wantErr: "invalid path"},
		{name: "Istio's env", env: []string{
			`ISTIO_KUBE_APP_PROBERS={"/app-health/a/livez":{"httpGet":{"port":80}}}`, "INSTANCE_IP=10.1.2.3",
			"REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION=true", "ISTIO_ENABLE_HTTP2_PROBING=false",
			`PROXY_CONFIG={"readinessProbe":{"httpGet":{"path":"/ready","port":8080},"periodSeconds":3}}`,
		}, envoy: true},
		{name: "a readinessProbe alone needs a prober", env: []string{
			"INSTANCE_IP=10.1.2.3", "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION=true", "ISTIO_ENABLE_HTTP2_PROBING=false",
			`PROXY_CONFIG={"readinessProbe":{"httpGet":{"path":"/ready","port":8080},"periodSeconds":3}}`,
		}, envoy: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := proberConfig(resolve(t, settings.Flags{DisableEnvoy: !tc.envoy}, tc.env...))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("proberConfig() error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (cfg == nil) != tc.wantOff {
				t.Fatalf("proberConfig() = %v, want a prober: %v", cfg, !tc.wantOff)
			}
			if tc.wantOff {
				return
			}
			if cfg.GetPodIp() != "10.1.2.3" || !cfg.GetLegacyLocalhostDestination() || !cfg.GetDisableHttp2Probing() || cfg.GetStatusPort() != 15020 {
				t.Errorf("proberConfig() = %v, want Istio's env carried over", cfg)
			}
			rp := &networking.ReadinessProbe{}
			if err := cfg.GetReadinessProbe().UnmarshalTo(rp); err != nil || rp.GetHttpGet().GetPort() != 8080 || rp.GetPeriodSeconds() != 3 {
				t.Errorf("readinessProbe = %v (%v), want PROXY_CONFIG's", rp, err)
			}
			if cfg.GetAgentReadyUrl() != "http://127.0.0.1:15020/healthz/ready" {
				t.Errorf("agent ready URL = %q, want the status port's /healthz/ready", cfg.GetAgentReadyUrl())
			}
		})
	}
}
