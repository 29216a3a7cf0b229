package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agentd/agentd/internal/status"
)

// waitCommand is pilot-agent wait: poll the readiness URL until it answers 200 (the
// holdApplicationUntilProxyStarts postStart hook). It takes Istio's flags, and --timeout.
func waitCommand() *cli.Command {
	return &cli.Command{
		Name:  "wait",
		Usage: "wait until the proxy is ready (pilot-agent wait)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "url", Value: status.DefaultWaitURL, Usage: "URL to use in requests"},
			&cli.IntFlag{Name: "timeoutSeconds", Value: 60, Usage: "maximum number of seconds to wait for Envoy to be ready"},
			&cli.DurationFlag{Name: "timeout", Usage: "maximum time to wait (overrides --timeoutSeconds)"},
			&cli.IntFlag{Name: "requestTimeoutMillis", Value: 500, Usage: "number of milliseconds to wait for response"},
			&cli.IntFlag{Name: "periodMillis", Value: 500, Usage: "number of milliseconds to wait between attempts"},
		},
		Action: func(c *cli.Context) error {
			timeout := time.Duration(c.Int("timeoutSeconds")) * time.Second
			if c.IsSet("timeout") {
				timeout = c.Duration("timeout")
			}
			fmt.Fprintf(c.App.ErrWriter, "Waiting for Envoy proxy to be ready (timeout: %v)...\n", timeout)
			err := status.Wait(c.Context, status.WaitOptions{
				URL:            c.String("url"),
				Timeout:        timeout,
				RequestTimeout: time.Duration(c.Int("requestTimeoutMillis")) * time.Millisecond,
				Period:         time.Duration(c.Int("periodMillis")) * time.Millisecond,
			})
			if err == nil {
				fmt.Fprintln(c.App.ErrWriter, "Envoy is ready!")
			}
			return err
		},
	}
}
