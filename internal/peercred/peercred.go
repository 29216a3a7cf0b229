// Package peercred keeps a Unix socket to its own user: it refuses clients whose peer
// credentials are neither root nor the serving process's effective user.
package peercred

import (
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// OwnerOnly wraps l: Accept closes the connections of other users and waits for the next.
// The socket's file mode may say as much; the peer credentials hold where it cannot (a
// socket left 0666 for compatibility, a directory others can enter, a socket passed on).
func OwnerOnly(l *net.UnixListener) net.Listener { return ownerOnly{l} }

type ownerOnly struct{ *net.UnixListener }

func (l ownerOnly) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		if Allowed(c) {
			return c, nil
		}
		c.Close()
	}
}

// Allowed tells whether the peer of c is root or this process's effective user.
func Allowed(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return false
	}
	return cred.Uid == 0 || int(cred.Uid) == os.Geteuid()
}
