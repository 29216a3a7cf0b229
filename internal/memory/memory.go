// Package memory gives a process's free heap back to the system after it handled a large
// message, which the Go runtime alone keeps for minutes.
package memory

import (
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
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
		releaseNow()
	})
}

// releaseNow gives the heap's free memory back: two collections (see Release).
func releaseNow() {
	runtime.GC() // moves what the pools hold to their victim caches
	debug.FreeOSMemory()
}

// Burst gives the heap's free memory back once a burst of small units of work (app probes,
// each a connection and a few KB of garbage) has ended: a second without work after at least
// Min units since the last release. A steady trickle (kubelet's probe every few seconds)
// never triggers it; a flood grows the heap to the high-water mark of its garbage, which the
// runtime's scavenger would keep for minutes.
type Burst struct {
	// Min is how many units make a burst.
	Min int64

	count atomic.Int64
	mu    sync.Mutex
	timer *time.Timer
}

// Done counts one unit of work.
func (b *Burst) Done() {
	if b.count.Add(1) < b.Min {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer == nil {
		b.timer = time.AfterFunc(burstIdle, b.end)
		return
	}
	b.timer.Reset(burstIdle)
}

func (b *Burst) end() {
	if b.count.Swap(0) < b.Min {
		return
	}
	releaseNow()
}

// burstIdle is how long without work ends a burst.
var burstIdle = time.Second

// TreeGCPercent is the collector's percentage (GOGC) of agentd and its helpers unless agentd's
// environment sets one: a collection when the heap grows by half rather than doubles. A
// process's heap here is mostly what it was handed at once (a name table, an xDS push, the
// bus's retained messages) and the garbage of decoding it; with 10 000 names and endpoints it
// keeps the tree's PSS about 15 MB lower in the helpers and 3-4 MB in agentd
// (scripts/bench/footprint.sh), for collections that are rare at steady state (dns-proxy's
// query path does not allocate). It applies from a process's first collection on
// (GCPercentFromFirstCollection).
const TreeGCPercent = 50

// GCPercentFromFirstCollection sets the collector's percentage (GOGC) to percent once the
// process has collected for the first time; until then Go's default (100) applies. A process
// collects first at 4 MB of heap with the default but at 2 MB with a GOGC of 50, which
// agentd's executable's initialisers alone come close to (1.85 MB). A process's first
// collections build the collector's own structures for every size class it uses, about
// 0.6-1 MB that stays; a helper that stays below 4 MB (the prober, sds-server, idle) then
// never pays it, and one that handles more collects from then on at percent.
func GCPercentFromFirstCollection(percent int) {
	// The sentinel is unreachable from the start, so the first collection frees it and then
	// runs the cleanup. It holds a pointer: the tiny allocator, which may keep small objects
	// without pointers alive together, never serves it.
	sentinel := &struct{ _ *byte }{}
	runtime.AddCleanup(sentinel, func(p int) { debug.SetGCPercent(p) }, percent)
}
