// Package connpass hands an accepted HTTP client connection, with the request already read
// from it, to another process over a Unix stream socket (the descriptor as SCM_RIGHTS), so
// that the receiving process answers the client itself: agentd's status server hands kubelet's
// app probe connections to the prober this way, and the prober hands back a connection whose
// later request is not an app probe. One message per connection: a 4-byte big-endian length,
// then the request (re-serialized) and whatever the sender had read past it; the descriptor
// rides on the message's first byte.
package connpass

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaxBody is the largest request body handed over (app probes have none).
const MaxBody = 64 << 10

// maxMessage bounds a message: the request head (net/http's default limit is 1 MiB), the
// body, and what the sender had buffered.
const maxMessage = 2<<20 + MaxBody

// Head is r as it came on the wire, for the receiver to read again: request line, Host,
// headers (canonical names, sorted), and body with its length.
func Head(r *http.Request, body []byte) []byte {
	var b bytes.Buffer
	b.WriteString(r.Method + " " + r.RequestURI + " " + r.Proto + "\r\n")
	// An HTTP/1.1 request that a server took had a Host field, perhaps an empty one.
	if r.Host != "" || r.ProtoAtLeast(1, 1) {
		b.WriteString("Host: " + r.Host + "\r\n")
	}
	h := r.Header.Clone()
	h.Del("Content-Length")
	h.Del("Transfer-Encoding")
	if len(body) > 0 {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	_ = h.Write(&b)
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}

// Sender sends connections on one Unix connection; it is safe for concurrent use.
type Sender struct {
	mu sync.Mutex
	uc *net.UnixConn
}

// NewSender sends on uc.
func NewSender(uc *net.UnixConn) *Sender { return &Sender{uc: uc} }

// Send hands conn over with data (Head of its request, then the bytes read past it). conn
// stays open on this side: the caller closes it, which leaves the receiver's copy open. A
// wrapper of the socket is unwrapped through its NetConn method, as crypto/tls's.
func (s *Sender) Send(conn net.Conn, data []byte) error {
	for { // a listener's wrapper (a limit, a deadline) keeps the socket inside
		u, ok := conn.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		conn = u.NetConn()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return fmt.Errorf("hand over a %T: not a socket", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return fmt.Errorf("hand over the connection: %w", err)
	}
	msg := make([]byte, 4+len(data))
	binary.BigEndian.PutUint32(msg, uint32(len(data)))
	copy(msg[4:], data)
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int
	cerr := raw.Control(func(fd uintptr) {
		n, _, err = s.uc.WriteMsgUnix(msg, unix.UnixRights(int(fd)), nil)
	})
	if cerr != nil {
		return fmt.Errorf("hand over the connection: %w", cerr)
	}
	if err != nil {
		return fmt.Errorf("hand over the connection: %w", err)
	}
	if n < len(msg) { // a stream socket may take part of it; the descriptor went with the first byte
		if _, err := s.uc.Write(msg[n:]); err != nil {
			return fmt.Errorf("hand over the connection: %w", err)
		}
	}
	return nil
}

// Close closes the Unix connection.
func (s *Sender) Close() error { return s.uc.Close() }

// Conn is a handed-over client connection: its first bytes are the request the sender read.
type Conn struct {
	net.Conn
	data *bytes.Reader // what the sender had read, not read here yet
	r    io.Reader
	// Back is the Unix connection it came on, to hand it back on.
	Back *Sender
}

func (c *Conn) Read(p []byte) (int, error) { return c.r.Read(p) }

// NetConn is the socket, for Send.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// Hijack takes r's connection from the server that read r, for Send: the connection and the
// data to send with it (r, then what the server or the sender before it had read past r).
// The caller closes conn once sent.
func Hijack(w http.ResponseWriter, r *http.Request) (conn net.Conn, data []byte, err error) {
	body, err := readBody(r)
	if err != nil {
		return nil, nil, err
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		return nil, nil, fmt.Errorf("a %s connection cannot be handed over", r.Proto)
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		return nil, nil, fmt.Errorf("take the connection: %w", err)
	}
	data = appendBuffered(Head(r, body), rw.Reader)
	if c, ok := conn.(*Conn); ok && c.data.Len() > 0 {
		rest, _ := io.ReadAll(c.data)
		data = append(data, rest...)
	}
	return conn, data, nil
}

// Unread returns c reading data first, then what c had not given out yet: c with what was
// read from it put back, for another server to read it from the start.
func (c *Conn) Unread(data []byte) *Conn {
	if c.data.Len() > 0 {
		rest, _ := io.ReadAll(c.data)
		data = append(data, rest...)
	}
	br := bytes.NewReader(data)
	return &Conn{Conn: c.Conn, data: br, r: io.MultiReader(br, c.Conn), Back: c.Back}
}

// readBody reads r's body, MaxBody at most.
func readBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		return nil, fmt.Errorf("read the request body: %w", err)
	}
	if len(body) > MaxBody {
		return nil, fmt.Errorf("request body over %d bytes", MaxBody)
	}
	return body, nil
}

// appendBuffered appends what br has read and not given out (pipelined requests).
func appendBuffered(data []byte, br *bufio.Reader) []byte {
	if n := br.Buffered(); n > 0 {
		rest, _ := br.Peek(n)
		data = append(data, rest...)
	}
	return data
}

// Receive reads the next handed-over connection from uc; back is set as its Back.
func Receive(uc *net.UnixConn, back *Sender) (*Conn, error) {
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := uc.ReadMsgUnix(hdr[:], oob)
	fds, perr := rights(oob[:oobn])
	closeAll := func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	if err != nil {
		closeAll()
		if n == 0 && errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("receive a connection: %w", err)
	}
	if n == 0 { // the peer closed
		closeAll()
		return nil, io.EOF
	}
	if perr != nil || len(fds) != 1 {
		closeAll()
		return nil, fmt.Errorf("receive a connection: want one descriptor, got %d (%v)", len(fds), perr)
	}
	if _, err := io.ReadFull(uc, hdr[n:]); err != nil {
		closeAll()
		return nil, fmt.Errorf("receive a connection: %w", err)
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxMessage {
		closeAll()
		return nil, fmt.Errorf("receive a connection: message of %d bytes, more than %d", size, maxMessage)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(uc, data); err != nil {
		closeAll()
		return nil, fmt.Errorf("receive a connection: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "handed-conn")
	c, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("receive a connection: %w", err)
	}
	br := bytes.NewReader(data)
	return &Conn{Conn: c, data: br, r: io.MultiReader(br, c), Back: back}, nil
}

func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		fs, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, fs...)
	}
	return fds, nil
}

// Listener is a net.Listener of received connections, for an http.Server to serve.
type Listener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	addr  net.Addr
}

// NewListener returns an empty listener; Put adds connections to it.
func NewListener(addr net.Addr) *Listener {
	return &Listener{conns: make(chan net.Conn), done: make(chan struct{}), addr: addr}
}

// Put gives c to the listener's Accept, or closes c when the listener is closed.
func (l *Listener) Put(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		_ = c.Close()
	}
}

// Accept returns the next received connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close makes Accept fail; later Puts close their connections.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is the address given to NewListener.
func (l *Listener) Addr() net.Addr { return l.addr }

// ServeFrom puts every connection received on uc into l until uc fails or closes, each with
// back as its Back.
func ServeFrom(uc *net.UnixConn, back *Sender, l *Listener) error {
	for {
		c, err := Receive(uc, back)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		l.Put(c)
	}
}
