package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

const (
	// upstreamUDPSize is the EDNS0 size dns-proxy asks upstreams for when the client asked
	// for less (Istio asks for none, and loses answers over 512 bytes: istio/istio#61371).
	upstreamUDPSize = 1232
	// udpConnsPerUpstream is how many connected UDP sockets each upstream gets; queries
	// share them and replies are matched by ID and question.
	udpConnsPerUpstream = 4
	// A UDP socket is replaced by a fresh one, on a new random source port, after this many
	// queries, this long, or a query that timed out on it: an off-path spoofer must guess the
	// port of a socket that lives briefly as well as the 16-bit ID, not only the ID of one of
	// four ports fixed for the life of the process. (Istio uses a socket per query.)
	udpQueriesPerSocket = 16
	udpSocketLifetime   = 10 * time.Second
	// maxIdleTCP is how many idle TCP connections each upstream keeps for reuse.
	maxIdleTCP = 4
)

// forwarder sends the queries dns-proxy does not answer to the resolv.conf nameservers,
// over the transport the query came in on, reusing sockets.
type forwarder struct {
	upstreams []*upstream
	timeout   time.Duration
	parallel  bool
	metrics   *metrics
	readers   sync.WaitGroup // the UDP reply readers
}

// upstream is one nameserver with its sockets.
type upstream struct {
	addr string

	mu     sync.Mutex
	closed bool
	udp    []*udpConn
	idle   []*dns.Conn // idle TCP connections
}

func newForwarder(servers []string, timeout time.Duration, parallel bool, m *metrics) *forwarder {
	f := &forwarder{timeout: timeout, parallel: parallel, metrics: m}
	for _, s := range servers {
		f.upstreams = append(f.upstreams, &upstream{addr: s})
	}
	return f
}

// forward returns the first upstream reply to req, as received, or nil when every upstream
// failed.
func (f *forwarder) forward(ctx context.Context, req *dns.Msg, tcp bool) []byte {
	f.metrics.upstreamRequests.Inc()
	start := time.Now()
	var resp []byte
	if q, err := newUpstreamQuery(req); err == nil {
		if f.parallel {
			resp = f.exchangeParallel(ctx, q, tcp)
		} else {
			resp = f.exchangeSequential(ctx, q, tcp)
		}
	}
	f.metrics.upstreamDuration.Observe(time.Since(start).Seconds())
	if resp == nil {
		f.metrics.upstreamFailures.Inc()
	}
	return resp
}

// exchangeSequential asks the upstreams one at a time, in an order shuffled per query as
// Istio does, and returns the first reply.
func (f *forwarder) exchangeSequential(ctx context.Context, q upstreamQuery, tcp bool) []byte {
	order := rand.Perm(len(f.upstreams))
	for _, i := range order {
		if resp, err := f.exchangeOne(ctx, f.upstreams[i], q, tcp); err == nil {
			return resp
		}
		if ctx.Err() != nil {
			return nil
		}
	}
	return nil
}

// exchangeParallel asks every upstream at once and returns the first reply.
func (f *forwarder) exchangeParallel(ctx context.Context, q upstreamQuery, tcp bool) []byte {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan []byte, len(f.upstreams))
	for _, u := range f.upstreams {
		go func() {
			resp, _ := f.exchangeOne(ctx, u, q, tcp)
			results <- resp
		}()
	}
	for range f.upstreams {
		if resp := <-results; resp != nil {
			return resp
		}
	}
	return nil
}

func (f *forwarder) exchangeOne(ctx context.Context, u *upstream, q upstreamQuery, tcp bool) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if tcp {
		return u.exchangeTCP(ctx, q)
	}
	cl := &call{question: q.question, done: make(chan result, 1)}
	c, id, err := u.udpCall(&f.readers, cl)
	if err != nil {
		return nil, err
	}
	return c.exchange(ctx, q, id, cl)
}

// close closes every upstream socket and waits for the reply readers.
func (f *forwarder) close() {
	for _, u := range f.upstreams {
		u.close()
	}
	f.readers.Wait()
}

// upstreamQuery is a query packed for the upstreams; each send sets its own ID.
type upstreamQuery struct {
	wire     []byte
	question []byte // the question section, which the reply must echo
}

// withID returns a copy of the query with the ID id.
func (q upstreamQuery) withID(id uint16) []byte {
	b := append([]byte(nil), q.wire...)
	binary.BigEndian.PutUint16(b, id)
	return b
}

// newUpstreamQuery packs req as sent upstream: with an EDNS0 size of at least
// upstreamUDPSize, so that large answers are not lost. The client's OPT options are kept.
func newUpstreamQuery(req *dns.Msg) (upstreamQuery, error) {
	q := &dns.Msg{MsgHdr: req.MsgHdr, Compress: true, Question: req.Question, Answer: req.Answer, Ns: req.Ns}
	var opt *dns.OPT
	for _, rr := range req.Extra {
		if o, ok := rr.(*dns.OPT); ok {
			opt = dns.Copy(o).(*dns.OPT)
			continue
		}
		q.Extra = append(q.Extra, rr)
	}
	if opt == nil {
		opt = &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
	}
	if opt.UDPSize() < upstreamUDPSize {
		opt.SetUDPSize(upstreamUDPSize)
	}
	q.Extra = append(q.Extra, opt)
	wire, err := q.Pack()
	if err != nil {
		return upstreamQuery{}, fmt.Errorf("pack upstream query: %w", err)
	}
	return upstreamQuery{wire: wire, question: wire[12:questionEnd(wire)]}, nil
}

func (u *upstream) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	for _, c := range u.udp {
		if c != nil {
			c.shut()
		}
	}
	for _, c := range u.idle {
		c.Close()
	}
	u.idle = nil
}

var errClosed = errors.New("forwarder closed")

// udpCall registers cl on one of the upstream's UDP sockets and returns it with the ID to
// send, dialing the pool on first use and replacing a socket that has served its share
// (udpQueriesPerSocket, udpSocketLifetime, a timeout) by a fresh one; the old one closes once
// its last pending query is done.
func (u *upstream) udpCall(readers *sync.WaitGroup, cl *call) (*udpConn, uint16, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, 0, errClosed
	}
	if len(u.udp) == 0 {
		u.udp = make([]*udpConn, udpConnsPerUpstream)
	}
	i := rand.IntN(len(u.udp))
	if c := u.udp[i]; c == nil || c.worn() {
		next, err := u.dialUDP(readers)
		if err != nil {
			return nil, 0, err
		}
		if c != nil {
			c.retire()
		}
		u.udp[i] = next
	}
	c := u.udp[i]
	id, err := c.register(cl)
	return c, id, err
}

func (u *upstream) dialUDP(readers *sync.WaitGroup) (*udpConn, error) {
	conn, err := net.Dial("udp", u.addr)
	if err != nil {
		return nil, fmt.Errorf("dial upstream %s: %w", u.addr, err)
	}
	c := &udpConn{conn: conn.(*net.UDPConn), calls: map[uint16]*call{}, born: time.Now()}
	readers.Go(c.readReplies)
	return c, nil
}

// udpConn is a connected UDP socket to one upstream shared by concurrent queries.
type udpConn struct {
	conn *net.UDPConn
	born time.Time

	mu       sync.Mutex
	calls    map[uint16]*call // by the ID sent upstream
	sent     int              // queries registered
	timedOut bool             // a query timed out on it
	retired  bool             // out of the pool: closes when calls is empty
	closed   bool
}

// worn tells whether c should be replaced before its next query.
func (c *udpConn) worn() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent >= udpQueriesPerSocket || c.timedOut || time.Since(c.born) >= udpSocketLifetime
}

// retire takes c out of service: it closes now, or when its last pending query is done.
func (c *udpConn) retire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retired = true
	c.closeIfDone()
}

// shut closes c at once: its pending queries fail.
func (c *udpConn) shut() {
	c.failAll(errClosed)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retired = true
	c.closeIfDone()
}

// closeIfDone closes a retired socket that has no query pending; c.mu is held.
func (c *udpConn) closeIfDone() {
	if c.retired && len(c.calls) == 0 && !c.closed {
		c.closed = true
		c.conn.Close()
	}
}

// call is one query waiting for its reply.
type call struct {
	question []byte
	done     chan result
}

type result struct {
	wire []byte
	err  error
}

// exchange sends q with id and waits for the reply to cl, registered under id.
func (c *udpConn) exchange(ctx context.Context, q upstreamQuery, id uint16, cl *call) ([]byte, error) {
	defer c.unregister(id, cl)
	if _, err := c.conn.Write(q.withID(id)); err != nil {
		return nil, fmt.Errorf("send to upstream %s: %w", c.conn.RemoteAddr(), err)
	}
	select {
	case r := <-cl.done:
		return r.wire, r.err
	case <-ctx.Done():
		c.mu.Lock()
		c.timedOut = true
		c.mu.Unlock()
		return nil, fmt.Errorf("upstream %s: %w", c.conn.RemoteAddr(), ctx.Err())
	}
}

// register gives cl a random ID that no other pending query on this socket uses.
func (c *udpConn) register(cl *call) (uint16, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errClosed
	}
	for range 64 {
		id := uint16(rand.Uint32())
		if _, taken := c.calls[id]; !taken {
			c.calls[id] = cl
			c.sent++
			return id, nil
		}
	}
	return 0, fmt.Errorf("upstream %s: too many queries in flight", c.conn.RemoteAddr())
}

func (c *udpConn) unregister(id uint16, cl *call) {
	c.mu.Lock()
	if c.calls[id] == cl {
		delete(c.calls, id)
	}
	c.closeIfDone()
	c.mu.Unlock()
}

// readReplies delivers each reply to the query with its ID and question, until the socket
// is closed. A refused port (the upstream is down) fails every pending query at once.
func (c *udpConn) readReplies() {
	buf := make([]byte, dns.MaxMsgSize)
	for {
		n, err := c.conn.Read(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			c.failAll(fmt.Errorf("upstream %s: %w", c.conn.RemoteAddr(), err))
			continue
		}
		if err != nil || n < 12 {
			continue
		}
		id := binary.BigEndian.Uint16(buf)
		c.mu.Lock()
		cl := c.calls[id]
		c.mu.Unlock()
		if cl == nil {
			continue
		}
		if !isReplyTo(buf[:n], cl.question) {
			continue
		}
		c.mu.Lock()
		if c.calls[id] == cl {
			delete(c.calls, id)
			cl.done <- result{wire: append([]byte(nil), buf[:n]...)}
		}
		c.mu.Unlock()
	}
}

func (c *udpConn) failAll(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, cl := range c.calls {
		delete(c.calls, id)
		cl.done <- result{err: err}
	}
}

// isReplyTo reports whether msg is a response that echoes the question section question.
func isReplyTo(msg, question []byte) bool {
	return len(msg) >= 12+len(question) && msg[2]&0x80 != 0 && binary.BigEndian.Uint16(msg[4:]) == 1 &&
		asciiEqualFold(msg[12:12+len(question)], question)
}

// exchangeTCP sends q on an idle TCP connection, or a new one, one query at a time. A
// reused connection the upstream has closed meanwhile is retried once on a new one.
func (u *upstream) exchangeTCP(ctx context.Context, q upstreamQuery) ([]byte, error) {
	for {
		conn, reused, err := u.tcpConn(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := roundTripTCP(ctx, conn, q)
		if err == nil {
			u.putIdle(conn)
			return resp, nil
		}
		conn.Close()
		if !reused || ctx.Err() != nil {
			return nil, fmt.Errorf("upstream %s over tcp: %w", u.addr, err)
		}
	}
}

func (u *upstream) tcpConn(ctx context.Context) (conn *dns.Conn, reused bool, err error) {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil, false, errClosed
	}
	if n := len(u.idle); n > 0 {
		conn = u.idle[n-1]
		u.idle = u.idle[:n-1]
		u.mu.Unlock()
		return conn, true, nil
	}
	u.mu.Unlock()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", u.addr)
	if err != nil {
		return nil, false, fmt.Errorf("dial upstream %s over tcp: %w", u.addr, err)
	}
	return &dns.Conn{Conn: c}, false, nil
}

func (u *upstream) putIdle(conn *dns.Conn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed || len(u.idle) >= maxIdleTCP {
		conn.Close()
		return
	}
	u.idle = append(u.idle, conn)
}

func roundTripTCP(ctx context.Context, conn *dns.Conn, q upstreamQuery) ([]byte, error) {
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	id := uint16(rand.Uint32())
	if _, err := conn.Write(q.withID(id)); err != nil {
		return nil, err
	}
	buf := make([]byte, dns.MaxMsgSize)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return nil, err
		}
		if n >= 12 && binary.BigEndian.Uint16(buf) == id && isReplyTo(buf[:n], q.question) {
			conn.SetDeadline(time.Time{})
			return append([]byte(nil), buf[:n]...), nil
		}
	}
}

// rcodeReply is an empty reply to req with rcode.
func rcodeReply(req *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	return m
}
