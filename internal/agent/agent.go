// Package agent is agentd's parent daemon: it builds the child table from its options, runs
// the supervisor, the bus and the control socket, and stops them in order.
package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/bus"
	"github.com/agentd/agentd/internal/control"
	"github.com/agentd/agentd/internal/proc"
	"github.com/agentd/agentd/internal/supervisor"
)

// RunDir is agentd's run directory under the root; it holds the control socket.
const RunDir = "var/run/agentd"

// ControlSocket is the control socket's path for an agentd whose root is root.
func ControlSocket(root string) string {
	return filepath.Join(root, RunDir, control.SocketName)
}

// Agent is a running agentd.
type Agent struct {
	opts     Options
	log      hclog.Logger
	bus      *bus.Broker
	metrics  *prometheus.Registry
	sup      *supervisor.Supervisor
	children []supervisor.Child
}

// New checks the options and builds the child table; nothing starts yet.
func New(opts Options) (*Agent, error) {
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	var err error
	if opts.Root == "" {
		opts.Root = "."
	}
	if opts.Root, err = filepath.Abs(opts.Root); err != nil {
		return nil, fmt.Errorf("root directory: %w", err)
	}
	if opts.HelpersDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find the helpers next to agentd: %w", err)
		}
		opts.HelpersDir = filepath.Dir(exe)
	}
	a := &Agent{opts: opts, log: opts.Log, bus: bus.New(), metrics: prometheus.NewRegistry()}
	if a.children, err = a.buildChildren(); err != nil {
		return nil, err
	}
	a.sup, err = supervisor.New(a.children, supervisor.Options{
		Log:          opts.Log,
		Root:         opts.Root,
		Metrics:      a.metrics,
		ReadyTimeout: opts.ReadyTimeout,
		DrainTimeout: opts.DrainTimeout,
		StopTimeout:  opts.StopTimeout,
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Run runs agentd until ctx ends, then stops the children in reverse order and returns nil.
func (a *Agent) Run(ctx context.Context) error {
	if os.Getpid() == 1 {
		a.log.Info("running as PID 1: reaping orphans")
	}
	a.log.Info("starting", "root", a.opts.Root, "helpers", a.opts.HelpersDir, "children", len(a.children))
	g, gctx := errgroup.WithContext(ctx)
	tasks := []func(context.Context) error{
		a.sup.Run,
		func(ctx context.Context) error { return control.Serve(ctx, ControlSocket(a.opts.Root), a) },
		func(ctx context.Context) error { proc.Reap(ctx); return nil },
	}
	for _, t := range tasks {
		g.Go(func() error { return t(gctx) })
	}
	err := g.Wait()
	a.log.Info("stopped")
	return err
}

// Kill ends every drain at once and kills the children still running: a second SIGTERM.
func (a *Agent) Kill() { a.sup.Kill() }

// Statuses, Ready, Restart and Swap are the supervisor's; Publish is the bus's: together they
// are what the control socket serves.
func (a *Agent) Statuses() []supervisor.Status                  { return a.sup.Statuses() }
func (a *Agent) Ready(ctx context.Context) error                { return a.sup.Ready(ctx) }
func (a *Agent) Restart(ctx context.Context, name string) error { return a.sup.Restart(ctx, name) }
func (a *Agent) Publish(topic string, payload *anypb.Any) error {
	_, err := a.bus.Publish(topic, payload)
	return err
}

func (a *Agent) Swap(ctx context.Context, name, binary, sha256 string, timeout time.Duration) error {
	return a.sup.Swap(ctx, name, binary, sha256, timeout)
}
