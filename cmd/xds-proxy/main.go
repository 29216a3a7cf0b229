// Command xds-proxy is agentd's xDS helper: it proxies the ADS streams of Envoy and proxyless
// gRPC clients to the control plane, on the socket agentd hands down. agentd starts it as a
// go-plugin child.
package main

import (
	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/xdsproxy"
)

func main() { component.Serve("xds-proxy", xdsproxy.New) }
