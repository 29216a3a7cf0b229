package supervisor

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestBinaryHashes: a binary is read once while it stays the same file; rewritten in place
// (same inode and size, new content) or replaced, it is read again.
func TestBinaryHashes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "helper")
	want := func(data string) string {
		s := sha256.Sum256([]byte(data))
		return hex.EncodeToString(s[:])
	}
	var h binaryHashes
	check := func(what, data string) {
		t.Helper()
		got, err := h.sum(path)
		if err != nil {
			t.Fatal(err)
		}
		if got != want(data) {
			t.Errorf("%s: sum %s, want %s", what, got, want(data))
		}
	}

	if err := os.WriteFile(path, []byte("version 1"), 0o755); err != nil {
		t.Fatal(err)
	}
	check("first read", "version 1")
	if len(h.sums) != 1 {
		t.Fatalf("%d sums remembered, want 1", len(h.sums))
	}
	check("same file again", "version 1")
	if len(h.sums) != 1 {
		t.Errorf("%d sums remembered after a second look at the same file, want 1", len(h.sums))
	}

	// Rewritten in place with as many bytes: the timestamps tell (set apart explicitly, as
	// two writes within one clock tick of the file system could share them).
	if err := os.WriteFile(path, []byte("version 2"), 0o755); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	check("rewritten in place", "version 2")

	// Replaced by another file (a new inode), as `install` and a rebuild do.
	next := path + ".new"
	if err := os.WriteFile(next, []byte("version 3"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, path); err != nil {
		t.Fatal(err)
	}
	check("replaced", "version 3")

	if _, err := h.sum(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing binary hashed without error")
	}
}
