package supervisor

import "time"

// Delay exposes the backoff delay to the tests.
func Delay(p BackoffPolicy, n int) time.Duration { return p.delay(n) }
