package e2e

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentd/agentd/internal/testing/asuser"
)

// limitFDs limits process pid to n open file descriptors, soft and hard: the processes it
// starts from then on inherit the limit.
func limitFDs(t *testing.T, pid int, n uint64) {
	t.Helper()
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}, nil); err != nil {
		t.Skipf("cannot set an fd limit: %v", err)
	}
}

// floodStatusPort opens n connections to the status port and leaves them idle: every other one
// after one request, kept alive, as a keep-alive client would. close ends the flood.
func floodStatusPort(t *testing.T, port, n int) (closeAll func()) {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var conns []net.Conn
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			continue // a full backlog: the flood is as big as it gets
		}
		conns = append(conns, c)
		if i%2 == 1 {
			io.WriteString(c, "GET /healthz/ready HTTP/1.1\r\nHost: flood\r\n\r\n")
		}
	}
	t.Logf("status port flood: %d of %d connections open", len(conns), n)
	return func() {
		for _, c := range conns {
			c.Close()
		}
	}
}

// TestStatusPortFloodAtFDLimit: agentd at a low file descriptor limit, its status port flooded
// with idle connections, several times its limit. Readiness answers, `agentd status` answers,
// and a helper killed during the flood comes back.
func TestStatusPortFloodAtFDLimit(t *testing.T) {
	port := freePort(t)
	a := startAgentd(t, []string{"ISTIO_META_DNS_CAPTURE=true"}, "--disable-envoy", "--status-port", strconv.Itoa(port))
	(&dnsAgent{Agentd: a}).publishTable(t, meshTable("10.0.0.1")) // what dns-proxy's readiness waits for
	before := childPids(t, a.WaitReady())
	if before["dns-proxy"] == 0 {
		t.Fatalf("no dns-proxy running: %v", before)
	}
	limitFDs(t, a.Pid(), 256)

	end := floodStatusPort(t, port, 1000)
	defer end()

	if code, body := statusGet(port, "/healthz/ready"); code != http.StatusOK {
		t.Errorf("readiness during the flood = %d %q, want 200", code, body)
	}
	if out, err := a.CLI("status"); err != nil {
		t.Errorf("agentd status during the flood: %v\n%s", err, out)
	}
	if err := syscall.Kill(before["dns-proxy"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := a.Status()
		if err == nil && st.Ready && childPids(t, st)["dns-proxy"] != before["dns-proxy"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dns-proxy not back and ready 20 s after kill -9 during the flood: %+v, %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _ := statusGet(port, "/healthz/ready"); code != http.StatusOK {
		t.Errorf("readiness after the restart, flood still on = %d, want 200", code)
	}
	end()
	if code, _ := statusGet(port, "/healthz/ready"); code != http.StatusOK {
		t.Errorf("readiness after the flood = %d, want 200", code)
	}
}

// TestSDSSocketOwnerOnly: the SDS socket agentd creates is 0666, as Istio's, under directories
// others may enter (deploy/systemd's are 0755); a client of another user is closed on at
// once, without the workload's key, while agentd's own user (Envoy's) is served.
func TestSDSSocketOwnerOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to connect as another user")
	}
	a := startAgentd(t, nil, "--disable-envoy")
	a.WaitReady()
	sock := sdsSocket(a)
	for d := filepath.Dir(sock); len(d) > 1; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil && !errors.Is(err, os.ErrPermission) {
			t.Fatal(err)
		}
		if d == filepath.Dir(a.Root) {
			break
		}
	}
	for _, tt := range []struct {
		uid    int
		served bool
	}{{65534, false}, {os.Geteuid(), true}} {
		// A gRPC server speaks first: its HTTP/2 SETTINGS frame.
		n, err := firstBytesAs(tt.uid, sock)
		if err != nil {
			t.Fatalf("client as uid %d: %v", tt.uid, err)
		}
		if served := n > 0; served != tt.served {
			t.Errorf("client as uid %d got %d bytes from the SDS socket, want served=%v", tt.uid, n, tt.served)
		}
	}
}

// firstBytesAs connects to a Unix socket as uid and counts what the server sends within 3 s.
func firstBytesAs(uid int, path string) (int, error) {
	c, err := asuser.Dial(uid, path)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, err := c.Read(make([]byte, 64))
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil
	}
	return n, err
}
