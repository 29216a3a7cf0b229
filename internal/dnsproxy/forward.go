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
	c, err := u.udpConn(&f.readers)
	if err != nil {
		return nil, err
	}
	return c.exchange(ctx, q)
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
		c.conn.Close()
	}
	for _, c := range u.idle {
		c.Close()
	}
	u.idle = nil
}

var errClosed = errors.New("forwarder closed")

// udpConn returns one of the upstream's UDP sockets, dialing the pool on first use.
func (u *upstream) udpConn(readers *sync.WaitGroup) (*udpConn, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, errClosed
	}
	if len(u.udp) == 0 {
		for range udpConnsPerUpstream {
			conn, err := net.Dial("udp", u.addr)
			if err != nil {
				return nil, fmt.Errorf("dial upstream %s: %w", u.addr, err)
			}
			c := &udpConn{conn: conn.(*net.UDPConn), calls: map[uint16]*call{}}
			u.udp = append(u.udp, c)
			readers.Go(c.readReplies)
		}
	}
	return u.udp[rand.IntN(len(u.udp))], nil
}

// udpConn is a connected UDP socket to one upstream shared by concurrent queries.
type udpConn struct {
	conn  *net.UDPConn
	mu    sync.Mutex
	calls map[uint16]*call // by the ID sent upstream
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

func (c *udpConn) exchange(ctx context.Context, q upstreamQuery) ([]byte, error) {
	cl := &call{question: q.question, done: make(chan result, 1)}
	id, err := c.register(cl)
	if err != nil {
		return nil, err
	}
	defer c.unregister(id, cl)
	if _, err := c.conn.Write(q.withID(id)); err != nil {
		return nil, fmt.Errorf("send to upstream %s: %w", c.conn.RemoteAddr(), err)
	}
	select {
	case r := <-cl.done:
		return r.wire, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("upstream %s: %w", c.conn.RemoteAddr(), ctx.Err())
	}
}

// register gives cl a random ID that no other pending query on this socket uses.
func (c *udpConn) register(cl *call) (uint16, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for range 64 {
		id := uint16(rand.Uint32())
		if _, taken := c.calls[id]; !taken {
			c.calls[id] = cl
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
