package agent

import (
	"fmt"
	"path/filepath"
	"strconv"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/kubeprobe"
	"github.com/agentd/agentd/internal/settings"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// ProbeSocket is the prober's Unix socket under the root; the status server forwards
// /app-health/... and /app-lifecycle/... to it.
var ProbeSocket = filepath.Join(RunDir, "probe.sock")

// proberConfig is the prober's configuration: the rewritten kubelet app probes
// (ISTIO_KUBE_APP_PROBERS, sent to INSTANCE_IP, or localhost with
// REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION; ISTIO_ENABLE_HTTP2_PROBING,
// ENABLE_PROBE_KEEPALIVE_CONNECTIONS) and the WorkloadEntry health check of the ProxyConfig's
// readinessProbe. It is nil when there is nothing to probe: Istio's agent then runs no prober
// either, and its status server answers /app-health/... with 400 (so does agentd's); agentd
// saves the process. A malformed ISTIO_KUBE_APP_PROBERS is refused, as Istio refuses it.
func proberConfig(s *settings.Settings) (*agentv1.ProberConfig, error) {
	e := &s.Env
	probes, err := kubeprobe.ParseKubeProbes(e.KubeAppProbers)
	if err != nil {
		return nil, fmt.Errorf("ISTIO_KUBE_APP_PROBERS: %w", err)
	}
	cfg := &agentv1.ProberConfig{
		KubeAppProbers:             e.KubeAppProbers,
		PodIp:                      e.InstanceIP,
		LegacyLocalhostDestination: e.LegacyLocalhostProbes,
		StatusPort:                 uint32(s.StatusPort),
		DisableHttp2Probing:        !e.HTTP2Probing,
		ProbeKeepaliveConnections:  e.ProbeKeepaliveConnections,
	}
	if rp := s.ProxyConfig.GetReadinessProbe(); rp != nil {
		if cfg.ReadinessProbe, err = anypb.New(rp); err != nil {
			return nil, fmt.Errorf("prober: readinessProbe: %w", err)
		}
		if !s.DisableEnvoy { // Istio checks Envoy's readiness first, unless Envoy is off
			cfg.AgentReadyUrl = "http://127.0.0.1:" + strconv.Itoa(s.StatusPort) + "/healthz/ready"
		}
	}
	if len(probes) == 0 && cfg.ReadinessProbe == nil {
		return nil, nil
	}
	return cfg, nil
}
