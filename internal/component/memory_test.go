package component

import (
	"runtime"
	"testing"
	"time"
)

// TestReleaseMemory: the free memory of a large transient allocation goes back to the
// system after ReleaseMemory, where the runtime alone keeps it for minutes.
func TestReleaseMemory(t *testing.T) {
	releaseDelay = 10 * time.Millisecond
	t.Cleanup(func() { releaseDelay = time.Second })
	retained := func() uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapIdle - ms.HeapReleased
	}

	// Small objects, as a decoded message is: their spans stay with the heap once freed.
	garbage := make([][]byte, 64<<10)
	for i := range garbage {
		garbage[i] = make([]byte, 1<<10)
	}
	garbage = nil
	runtime.GC() // freed, but still held by the heap
	if before := retained(); before < 32<<20 {
		t.Skipf("the runtime already gave back the garbage (%d MB held): nothing to test", before>>20)
	}
	ReleaseMemory()
	ReleaseMemory() // folded into the first
	deadline := time.Now().Add(10 * time.Second)
	for retained() >= 16<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("the heap still holds %d MB of free memory after ReleaseMemory", retained()>>20)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
