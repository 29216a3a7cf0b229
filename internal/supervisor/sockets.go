package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// openSockets opens every child's listening sockets once; they live as long as the supervisor,
// across every process of the child.
func (s *Supervisor) openSockets() error {
	for _, c := range s.children {
		// Memory each process of the child inherits and the next one finds as the last left
		// it (dns-proxy's journal of the queries it holds): a memfd, sized by the child.
		fd, err := unix.MemfdCreate("agentd-"+c.Name, unix.MFD_CLOEXEC)
		if err != nil {
			s.closeSockets()
			return fmt.Errorf("state memory of %s: %w", c.Name, err)
		}
		c.state = os.NewFile(uintptr(fd), "agentd-state-"+c.Name)
		for _, sock := range c.Sockets {
			f, err := s.openSocket(sock)
			if err != nil {
				s.closeSockets()
				return fmt.Errorf("open socket %s of %s: %w", sock.Name, c.Name, err)
			}
			c.files = append(c.files, f)
		}
	}
	return nil
}

func (s *Supervisor) closeSockets() {
	for _, c := range s.children {
		for i, f := range c.files {
			f.Close()
			if sock := c.Sockets[i]; sock.Network == "unix" && s.opts.Inherited[sock.Name] == nil {
				os.Remove(s.path(sock.Address))
			}
		}
		c.files = nil
		if c.state != nil {
			c.state.Close()
			c.state = nil
		}
	}
}

func (s *Supervisor) path(addr string) string {
	if filepath.IsAbs(addr) {
		return addr
	}
	return filepath.Join(s.opts.Root, addr)
}

// openSocket returns sock's listening socket as a descriptor outside agentd's poller: agentd
// only holds it for its children, and a descriptor in its poller would wake agentd's poller
// thread for every datagram and connection a child serves (about 4-7 µs of agentd's CPU per
// DNS query, scripts/bench/dns.sh).
func (s *Supervisor) openSocket(sock Socket) (*os.File, error) {
	if f := s.opts.Inherited[sock.Name]; f != nil {
		return unpolled(f)
	}
	f, err := listen(s.path, sock)
	if err != nil {
		return nil, err
	}
	return unpolled(f)
}

// unpolled returns a duplicate of f's descriptor in blocking mode, which Go does not put in
// its poller, and closes f, which takes f out of the poller. The mode belongs to the socket:
// a child that serves it from Go's poller sets it non-blocking again when it wraps it (as
// net.FileListener does), and agentd never changes it afterwards: os/exec leaves the mode of
// a descriptor outside the poller as it is.
func unpolled(f *os.File) (*os.File, error) {
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd, derr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("duplicate socket: %w", derr)
	}
	if err := unix.SetNonblock(nfd, false); err != nil {
		unix.Close(nfd)
		return nil, fmt.Errorf("blocking mode: %w", err)
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}

func listen(path func(string) string, sock Socket) (*os.File, error) {
	switch sock.Network {
	case "unix":
		return listenUnix(path(sock.Address), sock.Mode)
	case "tcp", "tcp4", "tcp6":
		l, err := net.Listen(sock.Network, sock.Address)
		if err != nil {
			return nil, err
		}
		defer l.Close()
		return l.(*net.TCPListener).File()
	case "udp", "udp4", "udp6":
		pc, err := net.ListenPacket(sock.Network, sock.Address)
		if err != nil {
			return nil, err
		}
		defer pc.Close()
		return pc.(*net.UDPConn).File()
	}
	return nil, fmt.Errorf("unknown network %q", sock.Network)
}

func listenUnix(path string, mode os.FileMode) (*os.File, error) {
	if mode == 0 {
		mode = 0o600
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	// A socket file left by an agentd that was killed would make the bind fail; anything else
	// at that path is not ours to remove.
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	defer l.Close()
	if err := os.Chmod(path, mode); err != nil {
		return nil, err
	}
	return l.File()
}
