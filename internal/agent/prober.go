package agent

import (
	"fmt"
	"path/filepath"
	"strconv"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/prober"
	"github.com/agentd/agentd/internal/supervisor"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// ProbeSocket is the prober's Unix socket under the root; the status server forwards
// /app-health/... and /app-lifecycle/... to it.
var ProbeSocket = filepath.Join(RunDir, "probe.sock")

// defaultStatusPort is Istio's status port (ProxyConfig statusPort).
const defaultStatusPort = 15020

// prober is the prober child: the rewritten kubelet app probes (ISTIO_KUBE_APP_PROBERS, sent
// to INSTANCE_IP, or localhost with REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION;
// ISTIO_ENABLE_HTTP2_PROBING, ENABLE_PROBE_KEEPALIVE_CONNECTIONS) and the WorkloadEntry health
// check of ProxyConfig readinessProbe. A malformed ISTIO_KUBE_APP_PROBERS stops agentd here.
// It is nil, no process at all, when there is nothing to probe (proberConfig).
func (a *Agent) prober() (*supervisor.Child, error) {
	cfg, err := a.proberConfig()
	if cfg == nil || err != nil {
		return nil, err
	}
	return a.helper("prober", cfg, supervisor.Socket{Name: agentv1.SocketProbe, Network: "unix", Address: ProbeSocket}), nil
}

// proberConfig is the prober's configuration, or nil when there is nothing to probe: no app
// probe in ISTIO_KUBE_APP_PROBERS and no ProxyConfig readinessProbe. Istio's agent then runs no
// prober either, and its status server answers /app-health/... with 400 (so does agentd's);
// agentd saves the process (about 10 MB). Pod specs do not change, so neither does this.
func (a *Agent) proberConfig() (*agentv1.ProberConfig, error) {
	env := a.opts.getenv
	probers := env("ISTIO_KUBE_APP_PROBERS")
	probes, err := prober.ParseKubeProbes(probers)
	if err != nil {
		return nil, fmt.Errorf("ISTIO_KUBE_APP_PROBERS: %w", err)
	}
	bools, err := envBools(&a.opts, map[string]bool{"REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION": false,
		"ISTIO_ENABLE_HTTP2_PROBING": true, "ENABLE_PROBE_KEEPALIVE_CONNECTIONS": false})
	if err != nil {
		return nil, err
	}
	statusPort := a.opts.StatusPort
	if statusPort == 0 {
		statusPort = defaultStatusPort
	}
	cfg := &agentv1.ProberConfig{
		KubeAppProbers:             probers,
		PodIp:                      env("INSTANCE_IP"),
		LegacyLocalhostDestination: bools["REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION"],
		StatusPort:                 uint32(statusPort),
		DisableHttp2Probing:        !bools["ISTIO_ENABLE_HTTP2_PROBING"],
		ProbeKeepaliveConnections:  bools["ENABLE_PROBE_KEEPALIVE_CONNECTIONS"],
	}
	ecfg, _, err := a.envoyConfig() // the merged ProxyConfig
	if err != nil {
		return nil, fmt.Errorf("prober: %w", err)
	}
	if rp := ecfg.ProxyConfig.GetReadinessProbe(); rp != nil {
		if cfg.ReadinessProbe, err = anypb.New(rp); err != nil {
			return nil, fmt.Errorf("prober: readinessProbe: %w", err)
		}
		if !a.opts.DisableEnvoy { // Istio checks Envoy's readiness first, unless Envoy is off
			cfg.AgentReadyUrl = "http://127.0.0.1:" + strconv.Itoa(statusPort) + "/healthz/ready"
		}
	}
	if len(probes) == 0 && cfg.ReadinessProbe == nil {
		return nil, nil
	}
	return cfg, nil
}
