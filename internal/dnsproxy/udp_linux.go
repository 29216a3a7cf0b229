package dnsproxy

import (
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// udpSocket reads and writes a UDP socket with recvmmsg and sendmmsg on a descriptor of its
// own that is not in Go's poller. Under load a poller registration costs a wake-up of the
// process's idle netpoll thread for every batch read and every batch written (EPOLLIN and
// EPOLLOUT edges), and the client pays for those wake-ups in its sends; a blocking read
// needs no poller.
type udpSocket struct {
	idx     int // its index among the server's UDP sockets
	fd      int
	wake    int // an eventfd that stop makes readable, for readers waiting in poll
	stopped atomic.Bool
}

// openUDPSocket takes a descriptor of conn's socket, puts the socket in blocking mode with a
// receive timeout (both belong to the socket, so every process sharing it, an old and a new
// dns-proxy during a swap, reads the same way) and closes conn, which takes the socket out of
// Go's poller. The socket stays open until close.
func openUDPSocket(conn *net.UDPConn) (*udpSocket, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("udp socket: %w", err)
	}
	nfd := -1
	var serr error
	if err := raw.Control(func(fd uintptr) {
		nfd, serr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, fmt.Errorf("udp socket: %w", err)
	}
	if serr != nil {
		return nil, fmt.Errorf("duplicate udp socket: %w", serr)
	}
	tv := unix.NsecToTimeval(udpReadTimeout.Nanoseconds())
	if serr = unix.SetNonblock(nfd, false); serr == nil {
		serr = unix.SetsockoptTimeval(nfd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	}
	if serr != nil {
		unix.Close(nfd)
		return nil, fmt.Errorf("set udp socket to blocking reads: %w", serr)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(nfd)
		return nil, fmt.Errorf("udp socket: eventfd: %w", err)
	}
	conn.Close()
	return &udpSocket{fd: nfd, wake: wake}, nil
}

// stop makes the readers return after their current read (at most udpReadTimeout).
func (u *udpSocket) stop() {
	u.stopped.Store(true)
	unix.Write(u.wake, []byte{1, 0, 0, 0, 0, 0, 0, 0})
}

func (u *udpSocket) close() error {
	unix.Close(u.wake)
	return unix.Close(u.fd)
}

// mmsghdr is Linux's struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [unsafe.Sizeof(uintptr(0)) - 4]byte
}

// datagrams is the memory of one recvmmsg or sendmmsg: datagrams and their peers' addresses.
type datagrams struct {
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	addrs []unix.RawSockaddrInet6 // room for IPv4 and IPv6 peers
	bufs  [][]byte
}

// newDatagrams returns a batch of n datagrams; size > 0 gives each a buffer of that size.
func newDatagrams(n, size int) *datagrams {
	b := &datagrams{
		hdrs:  make([]mmsghdr, n),
		iovs:  make([]unix.Iovec, n),
		addrs: make([]unix.RawSockaddrInet6, n),
		bufs:  make([][]byte, n),
	}
	if size > 0 {
		for i := range n {
			b.bufs[i] = make([]byte, size)
		}
	}
	b.link()
	return b
}

// link points each datagram's header at its iovec and peer address, and each iovec at its
// buffer where it has one.
func (b *datagrams) link() {
	for i := range b.hdrs {
		if len(b.bufs[i]) > 0 {
			b.iovs[i].Base = &b.bufs[i][0]
		}
		h := &b.hdrs[i].hdr
		h.Iov = &b.iovs[i]
		h.SetIovlen(1)
		h.Name = (*byte)(unsafe.Pointer(&b.addrs[i]))
	}
}

// read fills b: it waits for the first datagram and takes the ones queued behind it, or
// returns n=0 when the socket has been idle for udpReadTimeout, after waiting for the next
// datagram or the stop. Under load it is one recvmmsg; an idle reader sleeps in poll, not
// waking up every udpReadTimeout.
func (u *udpSocket) read(b *datagrams) (int, error) {
	for i := range b.hdrs {
		h := &b.hdrs[i].hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.Flags = 0
		b.hdrs[i].n = 0 // in a journal: the datagram before is answered
		b.iovs[i].SetLen(len(b.bufs[i]))
	}
	for {
		n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(u.fd), uintptr(unsafe.Pointer(&b.hdrs[0])),
			uintptr(len(b.hdrs)), unix.MSG_WAITFORONE, 0, 0)
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			// The receive timeout in blocking mode, or no datagram in non-blocking mode (the
			// next dns-proxy of a swap sets it for a moment, wrapping the socket with
			// net.FilePacketConn before its reader starts): wait without spinning.
			if u.stopped.Load() {
				return 0, nil
			}
			fds := []unix.PollFd{{Fd: int32(u.fd), Events: unix.POLLIN}, {Fd: int32(u.wake), Events: unix.POLLIN}}
			if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
				return 0, fmt.Errorf("wait for udp queries: %w", err)
			}
			return 0, nil
		default:
			return 0, errno
		}
	}
}

// datagram returns the i-th datagram read, or ok=false when it was cut or its peer is not
// an IP address.
func (b *datagrams) datagram(i int) (pkt []byte, ok bool) {
	h := &b.hdrs[i]
	if h.hdr.Flags&unix.MSG_TRUNC != 0 || (b.addrs[i].Family != unix.AF_INET && b.addrs[i].Family != unix.AF_INET6) {
		return nil, false
	}
	return b.bufs[i][:h.n], true
}

// setReply makes the j-th datagram of b, a batch to write, pkt to the peer of from's i-th.
func (b *datagrams) setReply(j int, pkt []byte, from *datagrams, i int) {
	b.bufs[j] = pkt
	b.iovs[j].Base = unsafe.SliceData(pkt)
	b.iovs[j].SetLen(len(pkt))
	b.addrs[j] = from.addrs[i]
	b.hdrs[j].hdr.Namelen = from.hdrs[i].hdr.Namelen
}

// write sends datagrams from to to-1 of b without waiting for room in the socket's buffer
// and returns how many went.
func (u *udpSocket) write(b *datagrams, from, to int) (int, error) {
	for {
		sent, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(u.fd), uintptr(unsafe.Pointer(&b.hdrs[from])),
			uintptr(to-from), unix.MSG_DONTWAIT, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return int(sent), nil
	}
}

// peer is a datagram's sender, as the kernel gave it.
type peer struct {
	addr unix.RawSockaddrInet6
	len  uint32
}

// peer returns the sender of the i-th datagram read.
func (b *datagrams) peer(i int) peer {
	return peer{addr: b.addrs[i], len: b.hdrs[i].hdr.Namelen}
}

// writeTo sends one datagram to p, waiting for room in the socket's buffer.
func (u *udpSocket) writeTo(pkt []byte, p *peer) error {
	for {
		_, _, errno := unix.Syscall6(unix.SYS_SENDTO, uintptr(u.fd), uintptr(unsafe.Pointer(unsafe.SliceData(pkt))),
			uintptr(len(pkt)), 0, uintptr(unsafe.Pointer(&p.addr)), uintptr(p.len))
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return errno
		}
		return nil
	}
}

// String is the peer's address, for logs.
func (p *peer) String() string {
	switch p.addr.Family {
	case unix.AF_INET:
		a := (*unix.RawSockaddrInet4)(unsafe.Pointer(&p.addr))
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), ntohs(a.Port)).String()
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(p.addr.Addr), ntohs(p.addr.Port)).String()
	}
	return fmt.Sprintf("address family %d", p.addr.Family)
}

// ntohs reads a port as the kernel stores it, in network byte order.
func ntohs(port uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&port))
	return uint16(b[0])<<8 | uint16(b[1])
}
