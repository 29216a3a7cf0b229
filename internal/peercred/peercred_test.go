package peercred

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentd/agentd/internal/testing/asuser"
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

// readAs connects to path as uid and returns what it reads until EOF.
func readAs(t *testing.T, uid int, path string) string {
	t.Helper()
	c, err := asuser.Dial(uid, path)
	if err != nil {
		t.Fatalf("client as uid %d: %v", uid, err)
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("client as uid %d: %v", uid, err)
	}
	return string(b)
}
