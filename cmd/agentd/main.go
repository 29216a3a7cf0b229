// Command agentd is a per-workload service-mesh agent, compatible with Istio's pilot-agent: a
// thin parent that supervises Envoy and one helper binary per agent function.
package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	app := &cli.App{
		Name:  "agentd",
		Usage: "per-workload service-mesh agent (Istio pilot-agent compatible)",
		Commands: []*cli.Command{
			runCommand(),
			statusCommand(),
			restartCommand(),
			swapCommand(),
			versionCommand(),
		},
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "agentd:", err)
		os.Exit(1)
	}
}
