package agent

import (
	"cmp"
	"context"
	"time"

	"github.com/agentd/agentd/internal/notify"
	"github.com/agentd/agentd/internal/supervisor"
)

// notify tells systemd how agentd is doing when it runs as a Type=notify unit: READY=1 once
// every child is ready, WATCHDOG=1 while they stay so (with WatchdogSec=), STOPPING=1 with
// the longest the stop can take.
func (a *Agent) notify(ctx context.Context) error {
	return notify.Run(ctx, notify.Options{Ready: a.Ready, StopTimeout: a.stopBudget(), Log: a.log.Named("systemd")})
}

// stopBudget is the longest agentd's stop can take: the children drain and stop one after
// the other, each within the drain and stop deadlines, then agentd exits.
func (a *Agent) stopBudget() time.Duration {
	drain := cmp.Or(a.opts.DrainTimeout, supervisor.DefaultDrainTimeout)
	stop := cmp.Or(a.opts.StopTimeout, supervisor.DefaultStopTimeout)
	return time.Duration(len(a.children))*(drain+stop) + 5*time.Second
}
