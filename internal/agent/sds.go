package agent

import "github.com/agentd/agentd/internal/supervisor"

// sdsServer is the sds-server child: the workload SDS socket Envoy reads certificates from.
func (a *Agent) sdsServer() (*supervisor.Child, error) {
	return a.helper("sds-server", nil, supervisor.Socket{
		Name: "sds", Network: "unix", Address: "var/run/secrets/workload-spiffe-uds/socket", Mode: 0o666,
	}), nil
}
