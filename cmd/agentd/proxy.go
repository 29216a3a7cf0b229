package main

import (
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/agentd/agentd/internal/settings"
)

// proxyCommand is pilot-agent's `proxy [sidecar|router]`: it accepts every flag Istio's
// injection template and VM install pass, and ignores unknown ones as pilot-agent does, so
// that agentd (or a link to it named pilot-agent) is the istio-proxy entrypoint unchanged.
func proxyCommand() *cli.Command {
	return &cli.Command{
		Name:            "proxy",
		Usage:           "run as Istio's pilot-agent proxy: the helpers and Envoy (sidecar or router)",
		ArgsUsage:       "[sidecar|router] [pilot-agent flags]",
		SkipFlagParsing: true,
		Action: func(c *cli.Context) error {
			p, err := settings.ParseProxyCommand(c.Args().Slice())
			if err != nil {
				return proxyError{err}
			}
			level := p.LogLevel
			if v := os.Getenv("AGENTD_LOG_LEVEL"); v != "" {
				level = hclog.LevelFromString(v)
			}
			log := hclog.New(&hclog.LoggerOptions{Name: "agentd", Level: level, JSONFormat: p.Flags.Proxy.LogAsJSON, Output: os.Stderr})
			for _, f := range p.Seen {
				log.Info("FLAG", "name", f[0], "value", f[1])
			}
			for _, f := range p.Unknown {
				log.Info("ignoring unknown flag, as pilot-agent does", "flag", f)
			}
			if err := runAgent(log, p.Flags); err != nil {
				return proxyError{err}
			}
			return nil
		},
	}
}

// proxyError is an error of `agentd proxy`, which exits 255 as pilot-agent does.
type proxyError struct{ error }

func (e proxyError) Unwrap() error { return e.error }
