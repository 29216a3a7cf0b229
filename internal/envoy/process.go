package envoy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agentd/agentd/internal/proc"
	"github.com/agentd/agentd/internal/supervisor"
)

// ProcessOptions are how agentd runs one Envoy process and ends it.
type ProcessOptions struct {
	Args []string // Envoy's arguments (see Args)
	Dir  string   // working directory: the root Istio's relative paths are under
	Env  []string // Envoy's environment (Istio passes its own)
	// Stdout and Stderr are Envoy's (default: agentd's own, as Istio's agent hands Envoy its).
	Stdout, Stderr *os.File

	AdminHost string // the admin API's host (the bootstrap's localhost)
	AdminPort int    // ProxyConfig proxyAdminPort

	// InboundOnly drains only inbound listeners: sidecars (gateways drain all).
	InboundOnly bool
	// TerminationDrainDuration is how long Drain waits after asking Envoy to drain
	// (ProxyConfig terminationDrainDuration, Istio's default 5 s).
	TerminationDrainDuration time.Duration
	// ExitOnZeroActiveConnections makes Drain wait MinimumDrainDuration and then until
	// Envoy's listeners have no active downstream connection left, instead of
	// TerminationDrainDuration (Istio: EXIT_ON_ZERO_ACTIVE_CONNECTIONS).
	ExitOnZeroActiveConnections bool
	MinimumDrainDuration        time.Duration // Istio: MINIMUM_DRAIN_DURATION, default 5 s
	// MaxDrainDuration bounds the wait for zero connections (Istio has none; 0: only the
	// caller's deadline).
	MaxDrainDuration time.Duration
	// ExcludedListeners are the downstream_cx_active stats never counted (IstioListenerStats).
	ExcludedListeners map[string]bool
	// PollInterval is how often active connections are counted (default 1 s, as Istio).
	PollInterval time.Duration

	// Control is shared by every process of the Envoy child (default: one per process).
	Control *DrainControl

	// OnUnexpectedExit is called when Envoy exits without Stop having asked it to (a crash,
	// a kill -9, an exit of its own): Istio's agent then exits.
	OnUnexpectedExit func(err error)

	// Prepare runs before each start, e.g. to write the bootstrap; Cleanup after each exit.
	Prepare func() error
	Cleanup func()

	Log hclog.Logger // Envoy's output lines and the lifecycle steps
}

// DrainControl changes how Envoy's coming drains go, whichever process is running: agentd's
// /quitquitquit (stop without draining) and /drain (drained already) use it.
type DrainControl struct{ skip atomic.Bool }

// Skip makes every later Drain return at once.
func (d *DrainControl) Skip() { d.skip.Store(true) }

// Skipped tells whether Skip was called.
func (d *DrainControl) Skipped() bool { return d.skip.Load() }

// Launch returns the supervisor's constructor of Envoy processes.
func Launch(o ProcessOptions) supervisor.Launch {
	return func(ctx context.Context, binary string, _ []*os.File) (supervisor.Instance, error) {
		return Start(binary, o)
	}
}

// Process is one running Envoy: a supervisor.Instance.
type Process struct {
	o     ProcessOptions
	p     *proc.Process
	admin *Admin
	log   hclog.Logger
	done  chan struct{}

	stopping atomic.Bool // Stop was called: the exit is expected

	mu         sync.Mutex
	configSeen bool // CDS and LDS accepted once; cached, as Istio's probe does
	live       bool // LIVE with workers started once
}

// Start starts Envoy from binary in its own process group, with SIGKILL as its
// parent-death signal, its output logged line by line.
func Start(binary string, o ProcessOptions) (*Process, error) {
	if o.Log == nil {
		o.Log = hclog.NewNullLogger()
	}
	if o.PollInterval == 0 {
		o.PollInterval = time.Second
	}
	if o.Control == nil {
		o.Control = &DrainControl{}
	}
	if o.Prepare != nil {
		if err := o.Prepare(); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(binary, o.Args...)
	cmd.Dir, cmd.Env = o.Dir, o.Env
	// Envoy's output is Envoy's, as under Istio's agent: its access log and its own log lines
	// reach log pipelines exactly as it writes them, at every agentd log level. Files, not
	// io.Writers: the child gets the descriptors themselves, and os/exec copies nothing.
	cmd.Stdout, cmd.Stderr = cmp.Or(o.Stdout, os.Stdout), cmp.Or(o.Stderr, os.Stderr)
	o.Log.Info("Envoy command", "binary", binary, "args", strings.Join(o.Args, " "))
	p, err := proc.Start(cmd)
	if err != nil {
		if o.Cleanup != nil {
			o.Cleanup()
		}
		return nil, fmt.Errorf("start envoy %s: %w", binary, err)
	}
	e := &Process{o: o, p: p, admin: NewAdmin(o.AdminHost, o.AdminPort), log: o.Log, done: make(chan struct{})}
	go e.wait()
	return e, nil
}

// wait reports Envoy's exit.
func (e *Process) wait() {
	<-e.p.Done()
	switch err := e.p.Err(); {
	case err == nil:
		e.log.Info("Envoy exited normally", "pid", e.Pid())
	case err.Error() == "signal: killed":
		e.log.Warn("Envoy exited with error; it may have been killed for using too much memory", "pid", e.Pid(), "error", err)
	default:
		e.log.Error("Envoy exited with error", "pid", e.Pid(), "error", err)
	}
	if e.o.Cleanup != nil {
		e.o.Cleanup()
	}
	if !e.stopping.Load() && e.o.OnUnexpectedExit != nil {
		e.o.OnUnexpectedExit(e.p.Err()) // before Exited: the supervisor must not restart first
	}
	close(e.done)
}

// Pid is Envoy's process id.
func (e *Process) Pid() int { return e.p.Pid() }

// Exited is closed once Envoy has exited.
func (e *Process) Exited() <-chan struct{} { return e.done }

// Err is how Envoy exited.
func (e *Process) Err() error { return e.p.Err() }

// Admin is the client of this Envoy's admin API.
func (e *Process) Admin() *Admin { return e.admin }

// Ready is Istio's judgement of Envoy: CDS and LDS updates accepted, then the server LIVE
// with its workers started. Each step is remembered once it has passed.
func (e *Process) Ready(ctx context.Context) error {
	e.mu.Lock()
	seen, live := e.configSeen, e.live
	e.mu.Unlock()
	if !seen {
		if err := e.admin.CheckConfigReceived(ctx); err != nil {
			return err
		}
		e.mu.Lock()
		e.configSeen = true
		e.mu.Unlock()
	}
	if !live {
		if err := e.admin.CheckLive(ctx); err != nil {
			return err
		}
		e.mu.Lock()
		e.live = true
		e.mu.Unlock()
	}
	return nil
}

// Metrics is Envoy's /stats/prometheus.
func (e *Process) Metrics(ctx context.Context) ([]byte, error) { return e.admin.Prometheus(ctx) }

// DrainNow drains Envoy's listeners at once and keeps it running afterwards (skip_exit), and
// makes the next Drain return at once: Istio's /drain (native sidecars' preStop).
func (e *Process) DrainNow(ctx context.Context) error {
	e.o.Control.Skip()
	e.log.Info("draining Envoy now; the coming stop will not drain again")
	return e.admin.DrainListeners(ctx, e.o.InboundOnly, true)
}

// Drain is Istio's graceful termination: ask Envoy to drain its listeners gracefully, then
// wait the termination drain duration, or, with ExitOnZeroActiveConnections, the minimum drain
// duration and then until no downstream connection is left (bounded by MaxDrainDuration). It
// returns early when Envoy exits or ctx ends; Envoy keeps running.
func (e *Process) Drain(ctx context.Context) error {
	if e.o.Control.Skipped() {
		e.log.Info("skipping drain: /quitquitquit or /drain was called")
		return nil
	}
	e.log.Info("draining Envoy's listeners", "inbound_only", e.o.InboundOnly)
	if err := e.admin.DrainListeners(ctx, e.o.InboundOnly, false); err != nil {
		e.log.Warn("error in invoking drain listeners endpoint", "error", err)
	}
	if !e.o.ExitOnZeroActiveConnections {
		e.log.Info("graceful termination period, starting", "duration", e.o.TerminationDrainDuration)
		if !e.sleep(ctx, e.o.TerminationDrainDuration) {
			return e.drainCut(ctx)
		}
		e.log.Info("graceful termination period complete")
		return nil
	}
	if e.o.MaxDrainDuration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.o.MaxDrainDuration)
		defer cancel()
	}
	e.log.Info("draining for the minimum drain duration, then waiting for active connections to end", "duration", e.o.MinimumDrainDuration)
	if !e.sleep(ctx, e.o.MinimumDrainDuration) {
		return e.drainCut(ctx)
	}
	return e.waitZeroConnections(ctx)
}

// waitZeroConnections polls downstream_cx_active until it is zero, the stat is missing, or
// five polls in a row fail.
func (e *Process) waitZeroConnections(ctx context.Context) error {
	e.log.Info("checking for active connections")
	failures := 0
	for {
		n, ok, err := e.admin.ActiveConnections(ctx, e.o.ExcludedListeners)
		switch {
		case err != nil:
			failures++
			e.log.Warn("unable to get listener stats from Envoy", "error", err, "failures", failures)
			if failures >= 5 {
				return nil
			}
		case !ok:
			e.log.Info("downstream_cx_active is not available: no connection was established yet or the stat is not enabled; skipping the active connections check")
			return nil
		case n == 0:
			e.log.Info("there are no more active connections")
			return nil
		default:
			failures = 0
			e.log.Info("there are still active connections", "active", n)
		}
		if !e.sleep(ctx, e.o.PollInterval) {
			return e.drainCut(ctx)
		}
	}
}

// drainCut explains why a drain wait ended early.
func (e *Process) drainCut(ctx context.Context) error {
	select {
	case <-e.done:
		e.log.Info("Envoy exited while draining")
		return nil
	default:
	}
	return fmt.Errorf("drain cut short: %w", context.Cause(ctx))
}

// sleep waits d; false when ctx ended or Envoy exited first.
func (e *Process) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-e.done:
		return false
	}
}

// Stop ends Envoy, each step only if the one before did not: POST /quitquitquit and wait
// half of the remaining time (at most 5 s), SIGTERM and wait until ctx ends, then SIGKILL
// of its process group. It returns once Envoy has exited.
func (e *Process) Stop(ctx context.Context) error {
	e.stopping.Store(true)
	steps := []struct {
		name string
		do   func() error
		wait func() time.Duration
	}{
		{"POST /quitquitquit", func() error {
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			return e.admin.Quit(qctx)
		}, func() time.Duration { return min(remaining(ctx)/2, 5*time.Second) }},
		{"SIGTERM", func() error { return e.p.Signal(syscall.SIGTERM) }, func() time.Duration { return remaining(ctx) }},
	}
	for _, s := range steps {
		select {
		case <-e.done:
			return nil
		default:
		}
		e.log.Info("stopping Envoy", "step", s.name, "pid", e.Pid())
		wait := s.wait()
		if err := s.do(); err != nil {
			// A failed step may still have worked (Envoy closing its admin API as it quits
			// before it answers): a second to show it, then the next step.
			e.log.Warn("stop step failed", "step", s.name, "error", err)
			wait = min(wait, time.Second)
		}
		if e.waitExit(ctx, wait) {
			return nil
		}
	}
	select {
	case <-e.done:
		return nil
	default:
	}
	e.log.Warn("stopping Envoy", "step", "SIGKILL", "pid", e.Pid())
	if err := e.p.Kill(); err != nil {
		return err
	}
	<-e.done
	return errors.New("envoy did not stop in time and was killed")
}

func (e *Process) waitExit(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-e.done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// remaining is the time left before ctx's deadline; a day when it has none.
func remaining(ctx context.Context) time.Duration {
	if ctx.Err() != nil {
		return 0
	}
	if dl, ok := ctx.Deadline(); ok {
		return time.Until(dl)
	}
	return 24 * time.Hour
}
