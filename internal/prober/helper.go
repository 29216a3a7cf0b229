package prober

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentd/agentd/internal/component"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// New is the helper's factory: it validates the configuration (a malformed
// ISTIO_KUBE_APP_PROBERS fails Configure with Istio's message) and takes the "probe" socket.
func New(env *component.Env) (component.Helper, error) {
	cfg := &agentv1.ProberConfig{}
	if err := env.UnmarshalConfig(cfg); err != nil {
		return nil, err
	}
	l, err := env.Listener(agentv1.SocketProbe)
	if err != nil {
		return nil, err
	}
	var reg prometheus.Registerer = env.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	return newHelper(cfg, l, env.Bus, env.Log, reg)
}
