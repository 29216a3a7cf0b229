package control

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/supervisor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backend is a fixed agentd for the control socket.
type backend struct{}

func (backend) Statuses() []supervisor.Status {
	return []supervisor.Status{{Name: "dns-proxy", Pid: 42, State: supervisor.Running}}
}
func (backend) Ready(context.Context) error                                       { return nil }
func (backend) Restart(context.Context, string) error                             { return supervisor.ErrUnknownChild }
func (backend) Swap(context.Context, string, string, string, time.Duration) error { return nil }
func (backend) Publish(string, *anypb.Any) error                                  { return nil }

func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(entries)
}

// TestNoConnectionLeftBehind: clients made per command, as `agentd status` and the tests make
// them, leave no connection open on either side once each call has returned: a long-lived
// caller of many commands does not accumulate file descriptors in agentd.
func TestNoConnectionLeftBehind(t *testing.T) {
	path := filepath.Join(t.TempDir(), SocketName)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, path, backend{}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := NewClient(path).Status(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("control socket never answered: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := openFDs(t)
	for range 50 {
		st, err := NewClient(path).Status(ctx)
		if err != nil || !st.Ready || len(st.Children) != 1 {
			t.Fatalf("Status = %+v, %v", st, err)
		}
	}
	// The server closes its side when it has read the client's close: poll briefly.
	for time.Now().Before(deadline) && openFDs(t) > before {
		time.Sleep(10 * time.Millisecond)
	}
	if after := openFDs(t); after > before {
		t.Errorf("%d file descriptors open after 50 status calls, %d before", after, before)
	}
	if err := NewClient(path).Restart(ctx, "nobody"); err == nil {
		t.Error("restart of an unknown child: no error")
	}
}

// TestClientDoesNotHang: an agentd that accepts the connection and never answers (hung, or
// out of file descriptors with the client in its queue) makes the command fail in time.
func TestClientDoesNotHang(t *testing.T) {
	path := filepath.Join(t.TempDir(), SocketName)
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c // held open, never answered
		}
	}()
	defer func() {
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	}()
	c := NewClient(path)
	c.Timeout = 300 * time.Millisecond
	errc := make(chan error, 1)
	go func() {
		_, err := c.Status(context.Background())
		errc <- err
	}()
	select {
	case err := <-errc:
		if err == nil {
			t.Error("Status from an agentd that never answered: no error")
		}
	case <-time.After(10 * time.Second):
		l.Close()
		t.Fatal("Status still waiting after 10 s on an agentd that never answers")
	}
}
