package agent

import "github.com/agentd/agentd/internal/supervisor"

// prober is the prober child: application probes and WorkloadEntry health checks.
func (a *Agent) prober() (*supervisor.Child, error) {
	return a.helper("prober", nil), nil
}
