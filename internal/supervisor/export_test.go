package supervisor

import "time"

// Delay exposes the backoff delay to the tests.
func Delay(p BackoffPolicy, n int) time.Duration { return p.delay(n) }

// DelayQueued exposes the backoff delay of a child serving sockets to the tests.
func DelayQueued(p BackoffPolicy, n int) time.Duration { return p.delayFor(n, true) }
