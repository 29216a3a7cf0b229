// Package asuser connects to a Unix socket as another user, for tests of agentd's peer
// credential checks: the connection is made from a thread that changed its own uid (a raw
// setresuid, not Go's process-wide one), and that thread ends with its goroutine.
package asuser

import (
	"net"
	"runtime"
	"syscall"
)

// Dial connects to the Unix socket at path as uid (needs root). The socket's peer
// credentials are uid's; the connection is then used from any goroutine.
func Dial(uid int, path string) (net.Conn, error) {
	type result struct {
		c   net.Conn
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
		rc <- result{c, err}
	}()
	r := <-rc
	return r.c, r.err
}
