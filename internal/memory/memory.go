// Package memory gives a process's free heap back to the system after it handled a large
// message, which the Go runtime alone keeps for minutes.
package memory

import (
	"runtime"
	"runtime/debug"
	"sync"
	"time"
)

// Large is the size of a message (a name table, an xDS push of thousands of
// resources) after whose handling a process calls Release.
const Large = 256 << 10

// releaseDelay is how long after a large message the heap's free memory is given back.
var releaseDelay = time.Second

var release struct {
	mu      sync.Mutex
	pending bool
}

// Release gives the heap's free memory back to the system shortly after a large
// message was handled (a name table, an xDS push of thousands of resources), at most once
// per releaseDelay. Without it a Go process keeps the high-water mark of decoding such a
// message for minutes, until the runtime's background scavenger catches up: with 10 000
// names and endpoints that is several MB per helper (scripts/bench/footprint.sh). The delay
// folds the messages of one push into one release, whose cost is two garbage collections:
// what sits in a sync.Pool (gRPC keeps the frames it read in pools, several MB after a large
// push) is dropped only by the second collection after it was put there (xds-proxy 3 MB less
// after a push of 10 000 endpoints).
func Release() {
	release.mu.Lock()
	defer release.mu.Unlock()
	if release.pending {
		return
	}
	release.pending = true
	time.AfterFunc(releaseDelay, func() {
		release.mu.Lock()
		release.pending = false
		release.mu.Unlock()
		runtime.GC() // moves what the pools hold to their victim caches
		debug.FreeOSMemory()
	})
}
