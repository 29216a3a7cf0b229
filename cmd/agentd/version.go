package main

import (
	"fmt"
	"runtime"

	"github.com/urfave/cli/v2"

	"github.com/agentd/agentd/internal/buildinfo"
	"github.com/agentd/agentd/internal/component"
)

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print agentd's version, commit, plugin protocol version and Go version",
		Action: func(*cli.Context) error {
			fmt.Printf("agentd %s (commit %s), plugin protocol %d, %s\n", buildinfo.Version, buildinfo.Commit, component.ProtocolVersion, runtime.Version())
			return nil
		},
	}
}
