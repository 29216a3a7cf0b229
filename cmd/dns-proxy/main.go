// Command dns-proxy is agentd's DNS helper: it answers mesh names from Istio's name table and
// forwards the rest upstream, on the sockets agentd hands down. agentd starts it as a
// go-plugin child.
package main

import (
	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/dnsproxy"
)

func main() { component.Serve("dns-proxy", dnsproxy.New) }
