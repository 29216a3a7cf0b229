// Package agent is agentd's parent daemon: it builds the child table from its options, runs
// the supervisor, the bus and the control socket, and stops them in order.
package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/bus"
	"github.com/agentd/agentd/internal/control"
	"github.com/agentd/agentd/internal/envoy"
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
	status   *statusRun // status.go
	// envoyDrain is shared by Envoy's processes and the status server (envoy.go).
	envoyDrain envoy.DrainControl
	// The merged ProxyConfig and Envoy's options, assembled once (envoy.go).
	proxyCfg  *envoy.Config
	proxyOpts envoy.ProcessOptions
	// The gRPC xDS bootstrap written for proxyless clients and its certificates (xdsproxy.go).
	grpcBootstrap, grpcCertDir string
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
	// systemd's variables are agentd's own: a child given LISTEN_* or NOTIFY_SOCKET would take
	// agentd's sockets or speak for it.
	opts.Env = slices.DeleteFunc(slices.Clone(opts.Env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == "LISTEN_PID" || k == "LISTEN_FDS" || k == "LISTEN_FDNAMES" || k == "NOTIFY_SOCKET" ||
			k == "WATCHDOG_USEC" || k == "WATCHDOG_PID"
	})
	a := &Agent{opts: opts, log: opts.Log, bus: bus.New(), metrics: prometheus.NewRegistry()}
	if err := a.loadVM(); err != nil {
		return nil, err
	}
	if a.opts.DiscoveryAddress == "" { // from the merged ProxyConfig, as Istio
		cfg, _, err := a.envoyConfig()
		if err != nil {
			return nil, err
		}
		a.opts.DiscoveryAddress = cfg.ProxyConfig.GetDiscoveryAddress()
	}
	if a.children, err = a.buildChildren(); err != nil {
		return nil, err
	}
	inherited, err := systemdSockets()
	if err != nil {
		return nil, err
	}
	a.sup, err = supervisor.New(a.children, supervisor.Options{
		Log:          opts.Log,
		Root:         opts.Root,
		Inherited:    inherited,
		Metrics:      a.metrics,
		ReadyTimeout: opts.ReadyTimeout,
		DrainTimeout: opts.DrainTimeout,
		StopTimeout:  opts.StopTimeout,
	})
	if err != nil {
		return nil, err
	}
	if a.status, err = a.newStatus(); err != nil {
		return nil, err
	}
	return a, nil
}

// Run runs agentd until ctx ends, then stops the children in reverse order and returns nil.
func (a *Agent) Run(ctx context.Context) error {
	// Orphans of the tree (a helper's own children) become agentd's to reap, as when it is
	// PID 1, instead of the host's init's.
	if err := proc.BecomeSubreaper(); err != nil && os.Getpid() != 1 {
		a.log.Warn("cannot become a subreaper: orphans of the tree go to init", "error", err)
	}
	if !hasVar(a.opts.Env, "GOGC") {
		debug.SetGCPercent(treeGOGC)
	}
	if !hasVar(a.opts.Env, "GOMAXPROCS") {
		runtime.GOMAXPROCS(treeGOMAXPROCS)
	}
	a.log.Info("starting", "root", a.opts.Root, "helpers", a.opts.HelpersDir, "children", len(a.children))
	g, gctx := errgroup.WithContext(a.status.quittable(ctx))
	tasks := []func(context.Context) error{
		a.status.around(a.sup.Run),
		func(ctx context.Context) error { return control.Serve(ctx, ControlSocket(a.opts.Root), a) },
		func(ctx context.Context) error { proc.Reap(ctx); return nil },
		a.notify,
	}
	for _, t := range tasks {
		g.Go(func() error { return t(gctx) })
	}
	err := g.Wait()
	a.log.Info("stopped")
	return err
}

// Ready is agentd's readiness: every child ready, and the gRPC bootstrap in place.
func (a *Agent) Ready(ctx context.Context) error {
	if err := a.sup.Ready(ctx); err != nil {
		return err
	}
	return a.grpcReady()
}

// Kill ends every drain at once and kills the children still running: a second SIGTERM.
func (a *Agent) Kill() { a.sup.Kill() }

// Statuses, Ready, Restart and Swap are the supervisor's; Publish is the bus's: together they
// are what the control socket serves.
func (a *Agent) Statuses() []supervisor.Status { return a.sup.Statuses() }

func (a *Agent) Restart(ctx context.Context, name string) error { return a.sup.Restart(ctx, name) }
func (a *Agent) Publish(topic string, payload *anypb.Any) error {
	_, err := a.bus.Publish(topic, payload)
	return err
}

func (a *Agent) Swap(ctx context.Context, name, binary, sha256 string, timeout time.Duration) error {
	return a.sup.Swap(ctx, name, binary, sha256, timeout)
}

// systemdSockets returns the sockets systemd handed agentd (agentd.socket), by their
// FileDescriptorName, which must be the name of the child socket it replaces (xds, sds, dns-udp,
// dns-tcp, ...). It clears LISTEN_* so that no child inherits them by mistake.
func systemdSockets() (map[string]*os.File, error) {
	out := map[string]*os.File{}
	for name, files := range activation.FilesWithNames() {
		if len(files) != 1 {
			return nil, fmt.Errorf("systemd passed %d sockets named %q, want one", len(files), name)
		}
		out[name] = files[0]
	}
	return out, nil
}
