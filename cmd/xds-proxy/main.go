// Command xds-proxy is agentd's xds-proxy helper, started by agentd as a go-plugin child. For now it is
// a minimal plugin: it serves the plugin contract and nothing else.
package main

import "github.com/agentd/agentd/internal/component"

func main() { component.Serve("xds-proxy", component.Minimal) }
