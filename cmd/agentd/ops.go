package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agentd/agentd/internal/agent"
	"github.com/agentd/agentd/internal/control"
)

func controlClient(c *cli.Context) *control.Client {
	return control.NewClient(agent.ControlSocket(c.String("root")))
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show the running agentd's children",
		Flags: []cli.Flag{rootFlag, &cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: func(c *cli.Context) error {
			st, err := controlClient(c).Status(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return json.NewEncoder(os.Stdout).Encode(st)
			}
			fmt.Printf("ready: %v\n", st.Ready)
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tPID\tSTATE\tRESTARTS\tUP\tSHA256\tBINARY")
			for _, ch := range st.Children {
				up, sum := "-", ch.SHA256
				if ch.Pid != 0 && !ch.StartedAt.IsZero() {
					up = time.Since(ch.StartedAt).Round(time.Second).String()
				}
				if len(sum) > 12 {
					sum = sum[:12]
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\t%s\t%s\n", ch.Name, ch.Pid, ch.State, ch.Restarts, up, sum, ch.Binary)
			}
			return w.Flush()
		},
	}
}

func restartCommand() *cli.Command {
	return &cli.Command{
		Name:      "restart",
		Usage:     "restart one child gracefully",
		ArgsUsage: "NAME",
		Flags:     []cli.Flag{rootFlag},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("restart needs the child's name")
			}
			return controlClient(c).Restart(c.Context, c.Args().First())
		},
	}
}

func swapCommand() *cli.Command {
	return &cli.Command{
		Name:      "swap",
		Usage:     "replace a helper's binary without dropping its sockets",
		ArgsUsage: "NAME",
		Flags: []cli.Flag{
			rootFlag,
			&cli.StringFlag{Name: "binary", Required: true, Usage: "the new binary"},
			&cli.StringFlag{Name: "sha256", Usage: "refuse the swap unless the binary has this SHA-256"},
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "time the new binary has to become ready"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("swap needs the child's name")
			}
			// agentd's working directory is not this one: it refuses relative paths.
			binary, err := filepath.Abs(c.String("binary"))
			if err != nil {
				return fmt.Errorf("not swapped: %w", err)
			}
			err = controlClient(c).Swap(c.Context, control.SwapRequest{
				Name: c.Args().First(), Binary: binary, SHA256: c.String("sha256"), Timeout: c.Duration("timeout"),
			})
			if err != nil {
				return fmt.Errorf("not swapped: %w", err)
			}
			fmt.Printf("swapped %s to %s\n", c.Args().First(), binary)
			return nil
		},
	}
}
