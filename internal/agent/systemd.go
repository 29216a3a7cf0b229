package agent

import (
	"context"
	"time"

	"github.com/agentd/agentd/internal/notify"
)

// notify tells systemd how agentd is doing when it runs as a Type=notify unit: READY=1 once
// every child is ready, WATCHDOG=1 while they stay so (with WatchdogSec=), STOPPING=1 with
// the longest the stop can take.
func (a *Agent) notify(ctx context.Context) error {
	return notify.Run(ctx, notify.Options{Ready: a.Ready, StopTimeout: a.stopBudget(), Log: a.log.Named("systemd")})
}

// stopBudget is the longest agentd's stop can take: the children's, then agentd's own exit.
func (a *Agent) stopBudget() time.Duration { return a.sup.StopBudget() + 5*time.Second }
