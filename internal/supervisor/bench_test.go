package supervisor_test

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/supervisor"
)

// BenchmarkRestartAfterKill measures kill -9 of a helper until its socket is served by the new
// process: the time a crash costs a client that was waiting in the socket's backlog. Each
// process is killed once it is running, and counts as a stable run, so every restart is a
// first retry.
func BenchmarkRestartAfterKill(b *testing.B) {
	opts := supervisor.Options{Backoff: supervisor.BackoffPolicy{StableAfter: time.Nanosecond}}
	f := start(b, opts, func(f *fixture) []supervisor.Child { return []supervisor.Child{child(f, "a", "helper")} })
	pid := f.waitRunning("a").Pid
	b.ResetTimer()
	for range b.N {
		syscall.Kill(pid, syscall.SIGKILL)
		for {
			got := f.servingPid("a")
			if got != pid {
				pid = got
				break
			}
		}
		b.StopTimer()
		f.waitRunning("a")
		b.StartTimer()
	}
}

// BenchmarkSwap measures `agentd swap` of a helper: start beside, ready, drain and stop the old.
func BenchmarkSwap(b *testing.B) {
	f := start(b, supervisor.Options{}, func(f *fixture) []supervisor.Child { return []supervisor.Child{child(f, "a", "helper")} })
	f.waitRunning("a")
	bins := []string{filepath.Join(binDir, "helper"), filepath.Join(b.TempDir(), "helper")}
	copyBinary(f.t, bins[1])
	b.ResetTimer()
	for i := range b.N {
		if err := f.sup.Swap(context.Background(), "a", bins[(i+1)%2], "", 30*time.Second); err != nil {
			b.Fatal(err)
		}
	}
}
