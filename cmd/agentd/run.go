package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/agentd/agentd/internal/agent"
	"github.com/agentd/agentd/internal/supervisor"
)

// rootFlag is --root, shared by every command that finds a running agentd.
var rootFlag = &cli.StringFlag{
	Name: "root", Value: ".", Usage: "directory Istio's relative paths (etc/istio/proxy, var/run/...) live under",
}

func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "run the agent: the helpers, Envoy, the bus, the control socket",
		Flags: []cli.Flag{
			rootFlag,
			&cli.StringFlag{Name: "helpers-dir", Usage: "directory of the helper binaries (default: agentd's own)"},
			&cli.BoolFlag{Name: "disable-envoy", EnvVars: []string{"DISABLE_ENVOY"}, Usage: "run without Envoy (proxyless gRPC)"},
			&cli.StringFlag{Name: "envoy-binary", Usage: "Envoy's path (default: ProxyConfig binaryPath, /usr/local/bin/envoy, else envoy on PATH)"},
			&cli.StringFlag{Name: "discovery-address", Usage: "upstream xDS server (default: ProxyConfig discoveryAddress, istiod.istio-system.svc:15012)"},
			&cli.StringFlag{Name: "dns-address", Value: "localhost:15053", EnvVars: []string{"DNS_PROXY_ADDR"}, Usage: "dns-proxy's UDP and TCP address"},
			&cli.StringFlag{Name: "resolv-conf", Value: "/etc/resolv.conf", Usage: "dns-proxy's upstream nameservers and search list"},
			&cli.IntFlag{Name: "status-port", Value: 15020, Usage: "status server port"},
			&cli.DurationFlag{Name: "ready-timeout", Value: supervisor.DefaultReadyTimeout, Usage: "how long the start waits for a helper to be ready before it starts Envoy anyway"},
			&cli.DurationFlag{Name: "drain-timeout", Value: supervisor.DefaultDrainTimeout, Usage: "time a child has to drain when stopped"},
			&cli.DurationFlag{Name: "stop-timeout", Value: supervisor.DefaultStopTimeout, Usage: "time a drained child has to exit before SIGKILL"},
			&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"AGENTD_LOG_LEVEL"}, Usage: "trace, debug, info, warn, error"},
			&cli.BoolFlag{Name: "log-json", Usage: "log JSON lines"},
		},
		Action: func(c *cli.Context) error {
			log := hclog.New(&hclog.LoggerOptions{
				Name: "agentd", Level: hclog.LevelFromString(c.String("log-level")), JSONFormat: c.Bool("log-json"),
				Output: os.Stderr,
			})
			a, err := agent.New(agent.Options{
				Root:             c.String("root"),
				HelpersDir:       c.String("helpers-dir"),
				DisableEnvoy:     c.Bool("disable-envoy"),
				EnvoyBinary:      c.String("envoy-binary"),
				DiscoveryAddress: c.String("discovery-address"),
				DNSAddress:       c.String("dns-address"),
				ResolvConf:       c.String("resolv-conf"),
				StatusPort:       c.Int("status-port"),
				Env:              os.Environ(),
				Log:              log,
				ReadyTimeout:     c.Duration("ready-timeout"),
				DrainTimeout:     c.Duration("drain-timeout"),
				StopTimeout:      c.Duration("stop-timeout"),
			})
			if err != nil {
				return err
			}
			return a.Run(signalContext(log, a))
		},
	}
}

// signalContext ends at the first SIGTERM or SIGINT (graceful stop); a second one kills the
// children still running and lets agentd exit at once.
func signalContext(log hclog.Logger, a *agent.Agent) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sigc
		log.Info("signal: stopping gracefully", "signal", s)
		cancel()
		s = <-sigc
		log.Warn("second signal: stopping now", "signal", s)
		a.Kill()
	}()
	return ctx
}
