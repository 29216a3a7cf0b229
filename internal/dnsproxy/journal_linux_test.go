package dnsproxy

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestNewJournalStaysUnwritten: a new memfd is an empty journal, so opening it writes only
// the headers; writing the rest made every page of its regions resident (2.4 MB of
// dns-proxy's memory). A journal of another layout is still cleared.
func TestNewJournalStaysUnwritten(t *testing.T) {
	fd, err := unix.MemfdCreate("journal-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "journal-test")
	defer f.Close()

	j, pending, err := openJournal(f, 2, 2)
	if err != nil || len(pending) != 0 {
		t.Fatalf("open a new journal: %v, %d pending", err, len(pending))
	}
	if got, limit := resident(t, j.mem), 1+journalRegions; got > limit { // the headers
		t.Errorf("a new journal of %d pages has %d resident, want at most %d", len(j.mem)/pageSize, got, limit)
	}
	if len(j.free) != slowSlots {
		t.Errorf("%d free slots, want %d", len(j.free), slowSlots)
	}
	j.slots[0].pending.Store(1) // a query left by this process
	unix.Munmap(j.mem)

	// The same memory with another layout (another build's sockets): cleared, nothing pending.
	j2, pending, err := openJournal(f, 1, 2)
	if err != nil || len(pending) != 0 {
		t.Fatalf("open the journal with another layout: %v, %d pending", err, len(pending))
	}
	defer unix.Munmap(j2.mem)
	for i, s := range j2.slots {
		if s.pending.Load() != 0 {
			t.Fatalf("slot %d still pending after a new layout", i)
		}
	}
}

// resident counts the pages of mem in memory.
func resident(t *testing.T, mem []byte) int {
	t.Helper()
	vec := make([]byte, (len(mem)+pageSize-1)/pageSize)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}
