package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/agentd/agentd/internal/agent"
	"github.com/agentd/agentd/internal/settings"
	"github.com/agentd/agentd/internal/supervisor"
)

// rootFlag is --root, shared by every command that finds a running agentd.
var rootFlag = &cli.StringFlag{
	Name: "root", Value: ".", Usage: "directory Istio's relative paths (etc/istio/proxy, var/run/...) live under",
}

// runCommand is agentd's own command line. Istio's environment variables (DISABLE_ENVOY,
// DNS_PROXY_ADDR, ...) are read by the settings table, as for `agentd proxy`; a flag given
// here wins over its variable.
func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "run the agent: the helpers, Envoy, the bus, the control socket",
		Flags: []cli.Flag{
			rootFlag,
			&cli.StringFlag{Name: "helpers-dir", Usage: "directory of the helper binaries (default: agentd's own)"},
			&cli.BoolFlag{Name: "disable-envoy", Usage: "run without Envoy (proxyless gRPC; or DISABLE_ENVOY=true)"},
			&cli.StringFlag{Name: "envoy-binary", Usage: "Envoy's path (default: ProxyConfig binaryPath, /usr/local/bin/envoy, else envoy on PATH)"},
			&cli.StringFlag{Name: "discovery-address", Usage: "upstream xDS server (default: ProxyConfig discoveryAddress, istiod.istio-system.svc:15012)"},
			&cli.StringFlag{Name: "dns-address", Usage: "dns-proxy's UDP and TCP address (default: DNS_PROXY_ADDR, localhost:15053)"},
			&cli.StringFlag{Name: "resolv-conf", Usage: "dns-proxy's upstream nameservers and search list (default: /etc/resolv.conf)"},
			&cli.IntFlag{Name: "status-port", Usage: "status server port (default: ProxyConfig statusPort, 15020)"},
			&cli.DurationFlag{Name: "ready-timeout", Value: supervisor.DefaultReadyTimeout, Usage: "how long a new helper process may take to be ready before it is reported as not ready (a swap: refused)"},
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
			return runAgent(log, settings.Flags{
				Root:             c.String("root"),
				HelpersDir:       c.String("helpers-dir"),
				DisableEnvoy:     c.Bool("disable-envoy"),
				EnvoyBinary:      c.String("envoy-binary"),
				DiscoveryAddress: c.String("discovery-address"),
				DNSAddress:       c.String("dns-address"),
				ResolvConf:       c.String("resolv-conf"),
				StatusPort:       c.Int("status-port"),
				ReadyTimeout:     c.Duration("ready-timeout"),
				DrainTimeout:     c.Duration("drain-timeout"),
				StopTimeout:      c.Duration("stop-timeout"),
			})
		},
	}
}

// runAgent resolves the settings, builds agentd and runs it until a signal stops it: the
// first SIGTERM or SIGINT stops gracefully, the second at once.
func runAgent(log hclog.Logger, flags settings.Flags) error {
	s, err := settings.Resolve(flags, os.Environ(), log)
	if err != nil {
		return err
	}
	a, err := agent.New(s, log)
	if err != nil {
		return err
	}
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigc)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for n := 0; ; n++ {
			select {
			case s := <-sigc:
				if n == 0 {
					log.Info("signal: stopping gracefully", "signal", s)
				} else {
					log.Warn("second signal: stopping now", "signal", s)
				}
				a.Stop(fmt.Errorf("signal %v", s))
			case <-done:
				return
			}
		}
	}()
	return a.Run(context.Background())
}
