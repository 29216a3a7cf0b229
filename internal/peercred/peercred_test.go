package peercred

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// TestOwnerOnly: on a socket open to all (0666), a client of another user is refused and a
// client of the server's own user is served. Needs root, to connect as another user.
func TestOwnerOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to connect as another user")
	}
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} { // t.TempDir's are the owner's only
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "socket")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	l := OwnerOnly(ul)
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "served")
			c.Close()
		}
	}()
	defer func() { l.Close(); <-done }()

	for _, tt := range []struct {
		uid  int
		want string
	}{
		{65534, ""}, // nobody: closed without a word
		{os.Geteuid(), "served"},
	} {
		if got := readAs(t, tt.uid, path); got != tt.want {
			t.Errorf("client as uid %d read %q, want %q", tt.uid, got, tt.want)
		}
	}
}

// readAs connects to path from a thread running as uid and returns what it reads until EOF.
// The thread changes its own user only (a raw setresuid, not Go's process-wide one) and
// ends with its goroutine, locked.
func readAs(t *testing.T, uid int, path string) string {
	t.Helper()
	type result struct {
		s   string
		err error
	}
	rc := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes away with this user
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(uid), uintptr(uid), 0); e != 0 {
			rc <- result{err: e}
			return
		}
		c, err := net.Dial("unix", path)
		if err != nil {
			rc <- result{err: err}
			return
		}
		defer c.Close()
		b, err := io.ReadAll(c)
		rc <- result{string(b), err}
	}()
	r := <-rc
	if r.err != nil {
		t.Fatalf("client as uid %d: %v", uid, r.err)
	}
	return r.s
}
