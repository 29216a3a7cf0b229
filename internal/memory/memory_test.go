package memory

import (
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"
)

// TestRelease: the memory of a large transient allocation goes back to the system after
// Release, where the runtime alone keeps it for minutes: freed small objects, and
// buffers left in a sync.Pool (gRPC keeps the frames it read in such pools).
func TestRelease(t *testing.T) {
	releaseDelay = 10 * time.Millisecond
	t.Cleanup(func() { releaseDelay = time.Second })
	// held is what the heap holds from the system: in use, or free but not given back.
	held := func() uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapSys - ms.HeapReleased
	}
	var pool sync.Pool
	tests := []struct {
		name string
		fill func() // 64 MB that nothing uses once it returns
	}{
		{"freed small objects, as a decoded message's", func() {
			garbage := make([][]byte, 64<<10)
			for i := range garbage {
				garbage[i] = make([]byte, 1<<10)
			}
			runtime.KeepAlive(garbage)
		}},
		{"buffers left in a sync.Pool", func() {
			for range 64 {
				pool.Put(make([]byte, 1<<20))
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			debug.FreeOSMemory()
			base := held()
			// No collection but Release's: the pool keeps all until then.
			defer debug.SetGCPercent(debug.SetGCPercent(-1))
			tc.fill()
			if held() < base+32<<20 {
				t.Skipf("the heap holds only %d MB more after the fill: nothing to test", (held()-base)>>20)
			}
			Release()
			Release() // folded into the first
			deadline := time.Now().Add(10 * time.Second)
			for held() >= base+16<<20 {
				if time.Now().After(deadline) {
					t.Fatalf("the heap still holds %d MB more than before the fill after Release", (held()-base)>>20)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestBurst: a burst of work followed by a pause releases the heap's free memory; fewer units
// than Min do not, nor does work that keeps coming.
func TestBurst(t *testing.T) {
	burstIdle = 50 * time.Millisecond
	t.Cleanup(func() { burstIdle = time.Second })
	held := func() uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapSys - ms.HeapReleased
	}
	fill := func() { // 64 MB of garbage, as a flood of probes leaves
		garbage := make([][]byte, 64<<10)
		for i := range garbage {
			garbage[i] = make([]byte, 1<<10)
		}
		runtime.KeepAlive(garbage)
	}
	tests := []struct {
		name        string
		units       int64
		wantRelease bool
	}{
		{"below Min", 9, false},
		{"a burst", 10, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			debug.FreeOSMemory()
			base := held()
			defer debug.SetGCPercent(debug.SetGCPercent(-1))
			fill()
			if held() < base+32<<20 {
				t.Skipf("the heap holds only %d MB more after the fill: nothing to test", (held()-base)>>20)
			}
			b := &Burst{Min: 10}
			for range tc.units {
				b.Done()
			}
			// Work that keeps coming holds the release off.
			for range 5 {
				time.Sleep(burstIdle / 2)
				if tc.wantRelease {
					b.Done()
				}
				if held() < base+16<<20 {
					t.Fatal("released while the burst went on")
				}
			}
			time.Sleep(burstIdle + 200*time.Millisecond)
			deadline := time.Now().Add(5 * time.Second)
			for tc.wantRelease && held() >= base+16<<20 {
				if time.Now().After(deadline) {
					t.Fatalf("the heap still holds %d MB more after the burst", (held()-base)>>20)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if !tc.wantRelease && held() < base+16<<20 {
				t.Errorf("released after %d units, below Min", tc.units)
			}
		})
	}
}

// TestGCPercentFromFirstCollection: the percentage stays as it is until the next collection,
// and is the one asked for once it ran. Automatic collection is off meanwhile (GOGC=off), so
// that the only collection is the test's.
func TestGCPercentFromFirstCollection(t *testing.T) {
	current := func() int {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		return p
	}
	old := debug.SetGCPercent(-1)
	t.Cleanup(func() { debug.SetGCPercent(old) })

	GCPercentFromFirstCollection(37)
	time.Sleep(10 * time.Millisecond)
	if got := current(); got != -1 {
		t.Fatalf("GOGC %d before a collection, want it unchanged (-1)", got)
	}
	runtime.GC()
	deadline := time.Now().Add(10 * time.Second)
	for current() != 37 {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC %d 10 s after a collection, want 37", current())
		}
		time.Sleep(time.Millisecond)
	}
}
