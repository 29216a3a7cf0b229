// Package agent is agentd's parent daemon: from the resolved Settings it builds each child's
// configuration (pure functions, one file per child) and the child table, then runs the
// supervisor, the bus, the status server and the control socket, and stops them in order.
package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/bus"
	"github.com/agentd/agentd/internal/control"
	"github.com/agentd/agentd/internal/envoy"
	"github.com/agentd/agentd/internal/envoy/bootstrap"
	"github.com/agentd/agentd/internal/memory"
	"github.com/agentd/agentd/internal/proc"
	"github.com/agentd/agentd/internal/settings"
	"github.com/agentd/agentd/internal/status"
	"github.com/agentd/agentd/internal/supervisor"
)

// RunDir is agentd's run directory under the root; it holds the control socket.
const RunDir = "var/run/agentd"

// ControlSocket is the control socket's path for an agentd whose root is root.
func ControlSocket(root string) string {
	return filepath.Join(root, RunDir, control.SocketName)
}

// Why agentd stops, besides its context: Stop's causes.
var (
	errQuit         = errors.New("/quitquitquit called")
	errEnvoyExited  = errors.New("Envoy exited")
	errStatusFailed = errors.New("status server failed")
)

// Agent is a running agentd.
type Agent struct {
	s        *settings.Settings
	cfg      *configs
	log      hclog.Logger
	bus      *bus.Broker
	metrics  *prometheus.Registry
	sup      *supervisor.Supervisor
	children []supervisor.Child
	// envoyDrain is shared by Envoy's processes and the status server.
	envoyDrain envoy.DrainControl
	// stops carries Stop's causes to Run: the first stops gracefully, the second at once.
	stops chan error
	// startup is istio_agent_startup_duration_seconds, set once, at the first readiness.
	startup   prometheus.Gauge
	startedUp sync.Once
	// envoyExited is set when Envoy's exit stops agentd: the supervisor must not start it again
	// while the tree stops.
	envoyExited atomic.Bool
	// grpcBootstrap is the gRPC xDS bootstrap written for proxyless clients, and the
	// certificates it names ("" when none): readiness waits for them (grpcReady).
	grpcBootstrap, grpcCertDir string
}

// New builds every child's configuration from s and the child table; a configuration that
// cannot work fails here, before anything starts. Nothing starts until Run.
func New(s *settings.Settings, log hclog.Logger) (*Agent, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	cfg, err := buildConfigs(s, os.Getuid())
	if err != nil {
		return nil, err
	}
	for _, w := range cfg.warnings {
		log.Warn(w)
	}
	if cfg.envoy != nil { // what Istio warns about in the bootstrap's input, at each render
		cfg.envoy.Warn = log.Named("envoy").Warn
	}
	a := &Agent{s: s, cfg: cfg, log: log, bus: bus.New(), metrics: prometheus.NewRegistry(), stops: make(chan error, 2)}
	a.startup = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "istio_agent_startup_duration_seconds", Help: "The time from the process starting to being marked ready.",
	})
	a.metrics.MustRegister(a.startup)
	a.children = a.childTable(cfg)
	inherited, err := systemdSockets()
	if err != nil {
		return nil, err
	}
	a.sup, err = supervisor.New(a.children, supervisor.Options{
		Log:          log,
		Root:         s.Root,
		Inherited:    inherited,
		Metrics:      a.metrics,
		ReadyTimeout: s.Flags.ReadyTimeout,
		DrainTimeout: s.Flags.DrainTimeout,
		StopTimeout:  s.Flags.StopTimeout,
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// buildConfigs is every child's configuration, from the Settings alone (and agentd's uid,
// for Istio's rule on DNS port 53).
func buildConfigs(s *settings.Settings, uid int) (*configs, error) {
	c := &configs{}
	var err error
	if c.prober, err = proberConfig(s); err != nil {
		return nil, fmt.Errorf("prober: %w", err)
	}
	if c.sds, c.sdsSock, err = sdsConfig(s); err != nil {
		return nil, fmt.Errorf("sds-server: %w", err)
	}
	if c.xds, err = xdsProxyConfig(s); err != nil {
		return nil, fmt.Errorf("xds-proxy: %w", err)
	}
	if s.DNSOn() {
		if c.dns, c.dnsSocks, c.warnings, err = dnsProxyConfig(s, uid); err != nil {
			return nil, fmt.Errorf("dns-proxy: %w", err)
		}
	}
	if !s.DisableEnvoy {
		c.envoy = bootstrapConfig(s)
		c.envoy.Warn = func(msg string, args ...any) {
			c.warnings = append(c.warnings, fmt.Sprint(append([]any{msg, " "}, args...)...))
		}
		var args []string
		var bootstrapPath string
		if args, bootstrapPath, err = envoyCommand(s, c.envoy); err != nil {
			return nil, fmt.Errorf("envoy: %w", err)
		}
		c.envoyRun = envoyProcess(s, c.envoy, args, bootstrapPath)
		if c.envoyRun.Prepare != nil { // agentd's bootstrap: a broken input fails here
			if _, err := bootstrap.Build(c.envoy); err != nil {
				return nil, fmt.Errorf("envoy bootstrap: %w", err)
			}
		}
	}
	return c, nil
}

// Run runs agentd until ctx ends or Stop is called, then stops the children in reverse order.
// Its tasks: the supervisor; the status server, which opens before the children start and
// closes once they have stopped, so that app probes and metrics answer during the drain; the
// control socket; the reaper of orphans; systemd's notifications; and stop, where every
// reason to stop arrives.
func (a *Agent) Run(ctx context.Context) error {
	a.tuneRuntime()
	if js, err := protojson.Marshal(a.s.ProxyConfig); err == nil {
		a.log.Info("effective ProxyConfig", "config", string(js))
	}
	if err := a.writeGRPCBootstrap(); err != nil {
		return err
	}
	var statusSrv *status.Server
	if a.s.StatusPort != 0 {
		var err error
		if statusSrv, err = a.newStatus(); err != nil {
			return err
		}
	} else {
		a.log.Warn("status port 0: no status server (readiness, app probes, merged metrics), as Istio's agent")
	}
	a.log.Info("starting", "root", a.s.Root, "helpers", a.s.HelpersDir, "children", len(a.children))
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	statusCtx, stopStatus := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStatus()
	supervised := make(chan struct{})
	var g errgroup.Group
	tasks := []func() error{
		func() error { defer close(supervised); defer stopStatus(); return a.sup.Run(ctx) },
		func() error { return a.runStatus(statusCtx, ctx, statusSrv) },
		func() error { return control.Serve(ctx, ControlSocket(a.s.Root), a) },
		func() error { return proc.Reap(ctx) },
		func() error { return a.notify(ctx) },
		func() error { a.stop(ctx, cancel, supervised); return nil },
	}
	for _, t := range tasks {
		g.Go(func() error {
			err := t()
			if err != nil {
				cancel(err) // a task that fails stops the others, the tree with them
			}
			return err
		})
	}
	err := g.Wait()
	if cause := context.Cause(ctx); errors.Is(cause, errStatusFailed) {
		err = errors.Join(err, cause)
	}
	a.log.Info("stopped", "cause", context.Cause(ctx))
	return err
}

// Stop asks agentd to stop, for cause: the first call drains and stops the tree in order, the
// next one kills what is left at once. Signals, POST /quitquitquit and Envoy's exit (with
// AGENTD_EXIT_ON_ENVOY_EXIT) all stop agentd through it.
func (a *Agent) Stop(cause error) {
	select {
	case a.stops <- cause:
	default: // two are pending already: the tree is being killed
	}
}

// stop ends Run's context with the first cause Stop gets, and kills the children at the
// second, until the supervisor has returned.
func (a *Agent) stop(ctx context.Context, cancel context.CancelCauseFunc, supervised <-chan struct{}) {
	select {
	case cause := <-a.stops:
		cancel(cause)
	case <-supervised:
		return
	case <-ctx.Done():
	}
	for {
		select {
		case <-a.stops:
			a.sup.Kill()
		case <-supervised:
			return
		}
	}
}

// onEnvoyExit is called when Envoy exits without agentd asking it to. A clean exit (status 0:
// POST :15000/quitquitquit, a Job's sidecar told to finish) stops agentd, which exits 0, as
// Istio's agent does. A crash is restarted in place by the supervisor (counted and logged as
// every child's), unless AGENTD_EXIT_ON_ENVOY_EXIT asks for Istio's exit on any exit.
func (a *Agent) onEnvoyExit(err error) {
	switch {
	case err == nil:
		a.log.Info("Envoy exited cleanly: stopping agentd, as Istio's agent does")
	case a.s.Env.ExitOnEnvoyExit:
		a.log.Warn("Envoy exited: stopping agentd, as Istio's agent does (AGENTD_EXIT_ON_ENVOY_EXIT)", "error", err)
	default:
		return
	}
	a.envoyExited.Store(true)
	a.Stop(errEnvoyExited)
}

// tuneRuntime applies the tree's Go runtime settings to agentd itself (helperenv.go).
func (a *Agent) tuneRuntime() {
	if err := proc.BecomeSubreaper(); err != nil && os.Getpid() != 1 {
		// Orphans of the tree (a helper's own children) then go to the host's init.
		a.log.Warn("cannot become a subreaper: orphans of the tree go to init", "error", err)
	}
	if !hasVar(a.s.Environ, "GOGC") {
		memory.GCPercentFromFirstCollection(memory.TreeGCPercent)
	}
	if !hasVar(a.s.Environ, "GOMAXPROCS") {
		runtime.GOMAXPROCS(treeGOMAXPROCS)
	}
}

// Ready is agentd's readiness: every child ready, and the gRPC bootstrap in place. The first
// time it is, istio_agent_startup_duration_seconds records the time since agentd started, as
// Istio's agent records it at its first successful readiness check.
func (a *Agent) Ready(ctx context.Context) error {
	if err := a.sup.Ready(ctx); err != nil {
		return err
	}
	if err := a.grpcReady(); err != nil {
		return err
	}
	a.startedUp.Do(func() {
		a.startup.Set(time.Since(processStart).Seconds())
		// The start's garbage (the bootstrap rendered, the children's configurations, the
		// helpers' handshakes) is about half of agentd's heap until the next collection:
		// given back once, agentd idles 1.5-2 MB smaller (docs/footprint.md).
		memory.Release()
	})
	return nil
}

// processStart is when agentd started, for istio_agent_startup_duration_seconds.
var processStart = time.Now()

// Statuses, Restart and Swap are the supervisor's; Publish is the bus's: together with Ready
// they are what the control socket serves.
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
