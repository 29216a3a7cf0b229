package notify

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// step is one answer of the Ready function (or the end of Run's context, with stop), and the
// datagram systemd must receive next ("" for none before the next step's).
type step struct {
	ready error
	stop  bool
	want  string
}

var errDNS = errors.New("dns-proxy is backoff")

func TestRun(t *testing.T) {
	tests := []struct {
		name        string
		watchdog    time.Duration
		stopTimeout time.Duration
		steps       []step
	}{{
		name:        "ready then stop",
		stopTimeout: 90 * time.Second,
		steps: []step{
			{ready: errDNS, want: "STATUS=not ready: dns-proxy is backoff"},
			{ready: errDNS}, // the same reason is not sent again
			{ready: errors.New("envoy is starting"), want: "STATUS=not ready: envoy is starting"},
			{want: "READY=1\nSTATUS=ready"},
			{stop: true, want: "STOPPING=1\nSTATUS=draining\nEXTEND_TIMEOUT_USEC=90000000"},
		},
	}, {
		name: "stopped before ready, no stop timeout",
		steps: []step{
			{ready: errDNS, want: "STATUS=not ready: dns-proxy is backoff"},
			{stop: true, want: "STOPPING=1\nSTATUS=draining"},
		},
	}, {
		name:        "watchdog only while healthy",
		watchdog:    20 * time.Millisecond,
		stopTimeout: 1500 * time.Millisecond,
		steps: []step{
			{want: "READY=1\nSTATUS=ready"},
			{want: "WATCHDOG=1"},
			{want: "WATCHDOG=1"},
			{ready: errDNS, want: "STATUS=unhealthy: dns-proxy is backoff"},
			{ready: errDNS}, // no WATCHDOG=1 while unhealthy: systemd's timer runs out
			{want: "WATCHDOG=1\nSTATUS=ready"},
			{want: "WATCHDOG=1"},
			{stop: true, want: "STOPPING=1\nSTATUS=draining\nEXTEND_TIMEOUT_USEC=1500000"},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := listen(t)
			t.Setenv("WATCHDOG_USEC", "")
			if tt.watchdog > 0 {
				t.Setenv("WATCHDOG_USEC", strconv.FormatInt(tt.watchdog.Microseconds(), 10))
				t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			answers := make(chan error)
			done := make(chan error, 1)
			go func() {
				done <- Run(ctx, Options{
					// The answers come from the test, whatever each check's own deadline.
					Ready: func(context.Context) error {
						select {
						case err := <-answers:
							return err
						case <-ctx.Done():
							return ctx.Err()
						}
					},
					StopTimeout: tt.stopTimeout,
					Poll:        time.Millisecond,
				})
			}()
			for i, s := range tt.steps {
				if s.stop {
					cancel()
				} else {
					select {
					case answers <- s.ready:
					case err := <-done:
						t.Fatalf("step %d: Run returned %v before its readiness was checked", i, err)
					}
				}
				if s.want != "" {
					if got := receive(t, sock); got != s.want {
						t.Fatalf("step %d: systemd received %q, want %q", i, got, s.want)
					}
				}
			}
			if err := <-done; err != nil {
				t.Fatalf("Run = %v, want nil", err)
			}
			sock.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if buf, err := readOne(sock); err == nil {
				t.Fatalf("systemd received %q after Run returned", buf)
			}
		})
	}
}

func TestRunWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	called := false
	err := Run(context.Background(), Options{Ready: func(context.Context) error { called = true; return nil }})
	if err != nil || called {
		t.Fatalf("Run without NOTIFY_SOCKET = %v (readiness checked: %v), want nil at once", err, called)
	}
}

// TestRunSocketGone checks that a notify socket nobody listens on does not stop agentd.
func TestRunSocketGone(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "gone.sock"))
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Ready: func(context.Context) error { close(ready); return nil }})
	}()
	<-ready
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

// listen binds a datagram socket as systemd's NOTIFY_SOCKET for the test.
func listen(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return c
}

func receive(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	msg, err := readOne(c)
	if err != nil {
		t.Fatalf("waiting for a notify message: %v", err)
	}
	return msg
}

func readOne(c *net.UnixConn) (string, error) {
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}
