// Package notify tells systemd how agentd is doing over its notify socket: READY=1 once
// agentd is ready, WATCHDOG=1 while it stays healthy, STOPPING=1 with the time the stop may
// take when it begins to drain.
package notify

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"
)

// Options are what Run needs; Ready is required, the zero value of the others works.
type Options struct {
	// Ready returns nil when agentd is ready and healthy, else the reason it is not.
	Ready func(context.Context) error
	// StopTimeout is the longest agentd's stop can take once ctx ends; it is sent with
	// STOPPING=1 as EXTEND_TIMEOUT_USEC, so that systemd waits for agentd's own deadlines
	// instead of killing the tree at TimeoutStopSec (0: not sent).
	StopTimeout time.Duration
	// Poll is how often readiness is checked before READY=1 (default 200ms).
	Poll time.Duration
	// CheckTimeout bounds one call of Ready (default 5s, capped at half the watchdog period).
	CheckTimeout time.Duration
	Log          hclog.Logger
}

// Run speaks the notify protocol until ctx ends: while agentd is not ready it sends its
// reason as STATUS= when it changes, then READY=1; with a watchdog (WatchdogSec=, seen as
// WATCHDOG_USEC) it sends WATCHDOG=1 every half period, only when Ready passes, so that
// systemd restarts an agentd whose children stay unhealthy; when ctx ends it sends STOPPING=1
// and EXTEND_TIMEOUT_USEC. Without NOTIFY_SOCKET (not under systemd) it does nothing.
// Errors sending are logged, never returned: systemd's view must not stop the agent.
func Run(ctx context.Context, opts Options) error {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return nil
	}
	if opts.Poll == 0 {
		opts.Poll = 200 * time.Millisecond
	}
	if opts.CheckTimeout == 0 {
		opts.CheckTimeout = 5 * time.Second
	}
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	watchdog, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		opts.Log.Warn("systemd watchdog settings ignored", "error", err)
		watchdog = 0
	}
	if watchdog > 0 {
		opts.CheckTimeout = min(opts.CheckTimeout, watchdog/2)
	}
	n := &notifier{opts: opts}
	if n.waitReady(ctx) {
		n.send("READY=1\nSTATUS=ready")
		n.status = "ready"
		if watchdog > 0 {
			n.watch(ctx, watchdog/2)
		}
		<-ctx.Done()
	}
	stopping := "STOPPING=1\nSTATUS=draining"
	if opts.StopTimeout > 0 {
		stopping += "\nEXTEND_TIMEOUT_USEC=" + strconv.FormatInt(opts.StopTimeout.Microseconds(), 10)
	}
	n.send(stopping)
	return nil
}

type notifier struct {
	opts   Options
	status string // the last STATUS= sent
}

// waitReady checks readiness every Poll until it passes (true) or ctx ends (false).
func (n *notifier) waitReady(ctx context.Context) bool {
	t := time.NewTicker(n.opts.Poll)
	defer t.Stop()
	for {
		err := n.check(ctx)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		n.setStatus("not ready: " + err.Error())
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// watch sends WATCHDOG=1 every period while agentd is healthy, until ctx ends.
func (n *notifier) watch(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := n.check(ctx); err != nil {
			if ctx.Err() == nil {
				n.setStatus("unhealthy: " + err.Error())
			}
			continue
		}
		msg := "WATCHDOG=1"
		if n.status != "ready" {
			msg += "\nSTATUS=ready"
			n.status = "ready"
		}
		n.send(msg)
	}
}

func (n *notifier) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.opts.CheckTimeout)
	defer cancel()
	return n.opts.Ready(ctx)
}

// setStatus sends STATUS=status if it differs from the last one sent.
func (n *notifier) setStatus(status string) {
	if status == n.status {
		return
	}
	n.status = status
	n.send("STATUS=" + status)
}

func (n *notifier) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.opts.Log.Warn("systemd notify", "state", state, "error", fmt.Errorf("send to NOTIFY_SOCKET: %w", err))
	}
}
