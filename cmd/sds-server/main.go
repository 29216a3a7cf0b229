// Command sds-server is agentd's sds-server helper, started by agentd as a go-plugin child:
// Istio's SDS server for Envoy, with workload certificates from the CA and from files.
package main

import (
	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/sds"
)

func main() { component.Serve("sds-server", sds.New) }
