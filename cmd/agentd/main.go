// Command agentd is a per-workload service-mesh agent, compatible with Istio's pilot-agent: a
// thin parent that supervises Envoy and one helper binary per agent function.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

func main() {
	if serveHelper(os.Args[0]) {
		return
	}
	app := &cli.App{
		Name:  "agentd",
		Usage: "per-workload service-mesh agent (Istio pilot-agent compatible)",
		Commands: []*cli.Command{
			runCommand(),
			statusCommand(),
			restartCommand(),
			swapCommand(),
			versionCommand(),
			proxyCommand(),
			requestCommand(),
			waitCommand(),
		},
	}
	if err := app.Run(flagsFirst(app.Commands, os.Args)); err != nil {
		fmt.Fprintln(os.Stderr, "agentd:", err)
		var pe proxyError
		if errors.As(err, &pe) {
			os.Exit(255) // pilot-agent's exit status on an error
		}
		os.Exit(1)
	}
}

// flagsFirst moves a command's flags before its positional arguments, so that
// `agentd swap NAME --binary PATH` parses: urfave/cli stops reading flags at the first argument.
func flagsFirst(cmds []*cli.Command, args []string) []string {
	if len(args) < 3 {
		return args
	}
	var cmd *cli.Command
	for _, c := range cmds {
		if c.HasName(args[1]) {
			cmd = c
		}
	}
	if cmd == nil || cmd.SkipFlagParsing {
		return args
	}
	takesValue := map[string]bool{}
	for _, f := range cmd.Flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, n := range f.Names() {
			takesValue[n] = !isBool
		}
	}
	var flags, positional []string
	rest := args[2:]
	for i := 0; i < len(rest); i++ {
		tok := rest[i]
		if tok == "--" {
			positional = append(positional, rest[i+1:]...)
			break
		}
		if !strings.HasPrefix(tok, "-") || tok == "-" {
			positional = append(positional, tok)
			continue
		}
		flags = append(flags, tok)
		name := strings.TrimLeft(tok, "-")
		if !strings.Contains(name, "=") && takesValue[name] && i+1 < len(rest) {
			i++
			flags = append(flags, rest[i])
		}
	}
	out := append([]string{args[0], args[1]}, flags...)
	if len(positional) > 0 {
		out = append(append(out, "--"), positional...)
	}
	return out
}
