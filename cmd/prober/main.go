// Command prober is agentd's prober helper, started by agentd as a go-plugin child: it answers
// the kubelet app probes agentd's status server forwards and runs the WorkloadEntry health check.
package main

import (
	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/prober"
)

func main() { component.Serve("prober", prober.New) }
