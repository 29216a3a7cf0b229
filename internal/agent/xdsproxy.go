package agent

import "github.com/agentd/agentd/internal/supervisor"

// xdsProxy is the xds-proxy child: the XDS socket Envoy and proxyless gRPC clients dial.
func (a *Agent) xdsProxy() (*supervisor.Child, error) {
	return a.helper("xds-proxy", nil, supervisor.Socket{
		Name: "xds", Network: "unix", Address: "etc/istio/proxy/XDS", Mode: 0o666,
	}), nil
}
