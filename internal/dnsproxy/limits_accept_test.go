package dnsproxy

import (
	"context"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// exhaustedListener fails every Accept as a process out of file descriptors does.
type exhaustedListener struct {
	accepts atomic.Int64
	closed  chan struct{}
}

func (l *exhaustedListener) Accept() (net.Conn, error) {
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
	}
	l.accepts.Add(1)
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

func (l *exhaustedListener) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}

func (l *exhaustedListener) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}
}

// TestAcceptBacksOffWhenOutOfFDs: out of file descriptors, the TCP server waits between
// accepts instead of spinning on a core; it still stops when asked.
func TestAcceptBacksOffWhenOutOfFDs(t *testing.T) {
	s := tableServer(t)
	l := &exhaustedListener{closed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, nil, []net.Listener{l}) }()
	time.Sleep(500 * time.Millisecond)
	n := l.accepts.Load()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not stop")
	}
	// 5 ms doubling to 1 s: about 7 tries in 500 ms; a busy loop makes millions.
	if n > 50 {
		t.Errorf("%d accepts in 500 ms while out of fds, want a backoff (at most 50)", n)
	}
}
