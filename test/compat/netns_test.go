package compat

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// netns is the network namespace of a process the test started under `unshare -n`: the
// test's own sockets (the probe app's listeners, its requests to the status port) are opened
// in it, so that they meet agentd's on loopback.
type netns struct{ f *os.File }

// openNetns waits (up to timeout) until pid has left the test's network namespace, and opens
// its namespace.
func openNetns(pid int, timeout time.Duration) (*netns, error) {
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("read the test's network namespace: %w", err)
	}
	path := fmt.Sprintf("/proc/%d/ns/net", pid)
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if ns, err := os.Readlink(path); err == nil && ns != self {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("process %d did not enter a network namespace of its own within %v", pid, timeout)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open the agent's network namespace: %w", err)
	}
	return &netns{f: f}, nil
}

func (n *netns) Close() error { return n.f.Close() }

// do runs fn on an OS thread moved into the namespace. The thread is never given back to
// other goroutines: it ends with its goroutine. A socket keeps the namespace it was made in,
// whichever thread uses it later.
func (n *netns) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the runtime drops the thread
		if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter the agent's network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// listen opens a TCP listener in the namespace.
func (n *netns) listen(addr string) (net.Listener, error) {
	var l net.Listener
	err := n.do(func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// dial connects to addr in the namespace.
func (n *netns) dial(addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() (err error) {
		c, err = net.DialTimeout("tcp", addr, timeout)
		return err
	})
	return c, err
}
