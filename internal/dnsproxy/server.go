package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// ErrNoTable is Ready's answer before the first name table.
var ErrNoTable = errors.New("dns-proxy has not received a name table yet")

// Config configures a Server. The zero value answers SERVFAIL to names it does not know.
type Config struct {
	// Names turns name tables into the names the server answers for.
	Names Names
	// Upstreams are the nameservers (host:port) unknown names are forwarded to.
	Upstreams []string
	// ForwardTimeout bounds each upstream attempt (DNS_FORWARD_TIMEOUT). Default 5s.
	ForwardTimeout time.Duration
	// ForwardParallel asks every upstream at once (DNS_FORWARD_PARALLEL).
	ForwardParallel bool
	// RespondBeforeSync forwards queries before the first table instead of SERVFAIL.
	RespondBeforeSync bool
	// UDPReaders is how many goroutines read each UDP socket. Default 2.
	UDPReaders int
	// MaxInFlight bounds the UDP queries being forwarded at once; more are dropped, and
	// the client retries. Default 4096.
	MaxInFlight int
	// Journal is memory that outlives the process (agentd's memfd for dns-proxy): the UDP
	// queries read and not yet answered are kept there, and the next process answers those
	// a killed one left. Nil: no journal.
	Journal *os.File
	// Log defaults to a null logger; Metrics to a private registry.
	Log     hclog.Logger
	Metrics prometheus.Registerer
}

// Server answers DNS over UDP and TCP.
type Server struct {
	cfg     Config
	log     hclog.Logger
	table   atomic.Pointer[Table]
	fwd     *forwarder
	metrics *metrics
	slots   chan struct{}
	jr      *journal // set by Serve before its readers start; nil without a journal
}

// NewServer returns a server with no table: it answers SERVFAIL until SetTable.
func NewServer(cfg Config) (*Server, error) {
	if cfg.ForwardTimeout <= 0 {
		cfg.ForwardTimeout = 5 * time.Second
	}
	if cfg.UDPReaders <= 0 {
		cfg.UDPReaders = 1
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 4096
	}
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	return &Server{
		cfg:     cfg,
		log:     cfg.Log,
		fwd:     newForwarder(cfg.Upstreams, cfg.ForwardTimeout, cfg.ForwardParallel, m),
		metrics: m,
		slots:   make(chan struct{}, cfg.MaxInFlight),
	}, nil
}

// SetNameTable builds the lookup table of nt and swaps it in; queries never wait for it.
func (s *Server) SetNameTable(nt *ndsv1.NameTable) *Table {
	t := NewTable(nt, s.cfg.Names)
	s.table.Store(t)
	return t
}

// Ready returns ErrNoTable until the first table, as Istio's readiness waits for it.
func (s *Server) Ready() error {
	if s.table.Load() == nil {
		return ErrNoTable
	}
	return nil
}

// Serve answers on the UDP sockets and TCP listeners until ctx ends. Then it stops reading,
// finishes the queries it has read, closes the sockets and returns nil.
func (s *Server) Serve(ctx context.Context, udp []net.PacketConn, tcp []net.Listener) error {
	// Queries already read are answered even after ctx ends; each forward has its timeout.
	work := context.WithoutCancel(ctx)
	socks := make([]*udpSocket, 0, len(udp))
	defer func() {
		for _, u := range socks {
			u.close()
		}
	}()
	for i, pc := range udp {
		uc, ok := pc.(*net.UDPConn)
		if !ok {
			return fmt.Errorf("serve dns: %T is not a UDP socket", pc)
		}
		u, err := openUDPSocket(uc)
		if err != nil {
			return err
		}
		u.idx = i
		socks = append(socks, u)
	}
	var inflight sync.WaitGroup
	if s.cfg.Journal != nil && len(socks) > 0 {
		jr, pending, err := openJournal(s.cfg.Journal, len(socks), s.cfg.UDPReaders)
		if err != nil {
			s.log.Warn("serving without a journal: a kill -9 loses the queries in hand", "error", err)
		} else {
			s.jr = jr
			defer jr.close() // after the queries in flight (deferred before)
		}
		if len(pending) > 0 {
			s.log.Info("answering the queries a killed dns-proxy left", "queries", len(pending))
		}
		for _, q := range pending {
			if q.sock < len(socks) {
				s.goSlow(work, &inflight, socks[q.sock], q.pkt, q.peer)
			}
		}
	}
	defer inflight.Wait()
	g, gctx := errgroup.WithContext(ctx)
	for _, u := range socks {
		for r := range s.cfg.UDPReaders {
			lane := u.idx*s.cfg.UDPReaders + r
			g.Go(func() error { s.readUDP(work, u, lane, &inflight); return nil })
		}
		g.Go(func() error {
			<-gctx.Done()
			u.stop()
			return nil
		})
	}
	for _, l := range tcp {
		s.serveTCP(gctx, work, g, l)
	}
	err := g.Wait()
	inflight.Wait()
	s.fwd.close()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// serveTCP runs a miekg server on l in g until ctx ends.
func (s *Server) serveTCP(ctx, work context.Context, g *errgroup.Group, l net.Listener) {
	started := make(chan struct{})
	srv := &dns.Server{
		Listener:          backoffListener{Listener: l, sleep: time.Sleep},
		NotifyStartedFunc: func() { close(started) },
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
			if _, err := w.Write(s.reply(work, req, true)); err != nil {
				s.log.Debug("write tcp reply", "client", w.RemoteAddr(), "error", err)
			}
		}),
	}
	g.Go(func() error {
		if err := srv.ActivateAndServe(); err != nil && ctx.Err() == nil {
			return fmt.Errorf("serve dns over tcp on %s: %w", l.Addr(), err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		select {
		case <-started:
			return srv.Shutdown()
		default:
			// Not started yet, or it failed to start (its error is the group's). Shutdown
			// refuses a server that has not started, which would then serve forever:
			// closing its listener ends it whenever it starts.
			_ = l.Close()
			return nil
		}
	})
}

const (
	// udpBatch is how many datagrams one read (recvmmsg) and one write (sendmmsg) carry.
	udpBatch = 8
	// maxUDPQuery is the largest query read; a longer one is dropped.
	maxUDPQuery = 4096
)

// readUDP reads queries in batches, answers the table hits in place and writes their
// replies in one batch, and hands every other query to a goroutine, until u is stopped.
// recvmmsg waits in the kernel for the first query and takes the ones queued behind it
// (udpSocket.read), which costs far less than a round through Go's poller per batch.
func (s *Server) readUDP(work context.Context, u *udpSocket, lane int, inflight *sync.WaitGroup) {
	in := newDatagrams(udpBatch, maxUDPQuery)
	if s.jr != nil {
		in = s.jr.batch(lane) // read into the journal: a kill -9 leaves the batch to the next process
	}
	out := newDatagrams(udpBatch, 0)
	replies := make([][]byte, udpBatch) // reused, so that a batch allocates nothing
	for i := range replies {
		replies[i] = make([]byte, 0, localUDPSize)
	}
	var scratch fastScratch
	for !u.stopped.Load() {
		n, err := u.read(in)
		if err != nil {
			s.log.Debug("read udp", "error", err)
			continue
		}
		t := s.table.Load()
		answered := 0
		for i := range n {
			pkt, ok := in.datagram(i)
			if !ok {
				continue
			}
			if t != nil {
				if reply, ok := scratch.reply(t, pkt, replies[answered][:0]); ok {
					s.metrics.requests.Inc()
					replies[answered] = reply
					out.setReply(answered, reply, in, i)
					answered++
					continue
				}
			}
			s.goSlow(work, inflight, u, pkt, in.peer(i))
		}
		for sent := 0; sent < answered; {
			n, err := u.write(out, sent, answered)
			if err != nil {
				s.log.Debug("write udp replies", "error", err)
				break
			}
			sent += n
		}
	}
}

// goSlow answers a query on the general path in a goroutine, or drops it when too many are
// in flight (the client retries).
func (s *Server) goSlow(work context.Context, inflight *sync.WaitGroup, u *udpSocket, pkt []byte, p peer) {
	select {
	case s.slots <- struct{}{}:
	default:
		return
	}
	slot, q := -1, []byte(nil)
	if s.jr != nil {
		slot, q = s.jr.hold(u.idx, pkt, &p)
	}
	if q == nil {
		q = append([]byte(nil), pkt...)
	}
	inflight.Go(func() {
		defer func() { <-s.slots }()
		s.serveUDPSlow(work, u, q, &p)
		if s.jr != nil {
			s.jr.release(slot)
		}
	})
}

// serveUDPSlow answers one UDP query the fast path did not, accepting and rejecting
// malformed queries as miekg's server does.
func (s *Server) serveUDPSlow(ctx context.Context, u *udpSocket, pkt []byte, p *peer) {
	req, reject := unpackQuery(pkt)
	var out []byte
	switch {
	case reject != nil:
		out, _ = reject.Pack()
	case req != nil:
		out = s.reply(ctx, req, false)
	default:
		return // not even a header, or a response: drop it
	}
	if err := u.writeTo(out, p); err != nil {
		s.log.Debug("write udp reply", "client", p.String(), "error", err)
	}
}

// unpackQuery returns the query in pkt, or the FORMERR/NOTIMP reply to send instead, or
// neither when pkt must be dropped — miekg's server's rules for its default accept func.
func unpackQuery(pkt []byte) (req, reject *dns.Msg) {
	if len(pkt) < 12 {
		return nil, nil
	}
	h := dns.Header{
		Id:      uint16(pkt[0])<<8 | uint16(pkt[1]),
		Bits:    uint16(pkt[2])<<8 | uint16(pkt[3]),
		Qdcount: uint16(pkt[4])<<8 | uint16(pkt[5]),
		Ancount: uint16(pkt[6])<<8 | uint16(pkt[7]),
		Nscount: uint16(pkt[8])<<8 | uint16(pkt[9]),
		Arcount: uint16(pkt[10])<<8 | uint16(pkt[11]),
	}
	action := dns.DefaultMsgAcceptFunc(h)
	if action == dns.MsgIgnore {
		return nil, nil
	}
	if action == dns.MsgAccept {
		req = new(dns.Msg)
		if err := req.Unpack(pkt); err == nil {
			return req, nil
		}
	}
	reject = &dns.Msg{MsgHdr: dns.MsgHdr{Id: h.Id, Response: true, Opcode: int(h.Bits>>11) & 0xF, Rcode: dns.RcodeFormatError}}
	if action == dns.MsgRejectNotImplemented {
		reject.Rcode = dns.RcodeNotImplemented
	}
	return nil, reject
}

// reply answers req with Istio's semantics, packed and truncated to what the client takes.
func (s *Server) reply(ctx context.Context, req *dns.Msg, tcp bool) []byte {
	s.metrics.requests.Inc()
	if len(req.Question) == 0 {
		return s.finish(req, rcodeReply(req, dns.RcodeServerFailure), tcp)
	}
	t := s.table.Load()
	if t == nil && !s.cfg.RespondBeforeSync {
		return s.finish(req, rcodeReply(req, dns.RcodeServerFailure), tcp)
	}
	if t != nil {
		q := req.Question[0]
		if answers, found := t.Lookup(strings.ToLower(q.Name), q.Qtype); found {
			resp := new(dns.Msg)
			resp.SetReply(req)
			resp.Authoritative = true
			resp.Answer = shuffled(answers)
			return s.finish(req, resp, tcp)
		}
	}
	wire := s.fwd.forward(ctx, req, tcp)
	if wire == nil {
		return s.finish(req, rcodeReply(req, dns.RcodeServerFailure), tcp)
	}
	return s.relay(req, wire, tcp)
}

// finish gives resp an OPT record exactly when req has one, truncates it to what the client
// takes, and packs it.
func (s *Server) finish(req, resp *dns.Msg, tcp bool) []byte {
	matchEDNS(req, resp)
	resp.Truncate(maxSize(req, tcp))
	out, err := resp.Pack()
	if err != nil {
		s.log.Debug("pack reply", "error", err)
		out, _ = rcodeReply(req, dns.RcodeServerFailure).Pack()
	}
	return out
}

// relay returns an upstream reply with the client's ID, as the client may receive it: as it
// came, or without the OPT record dns-proxy added, when that fits; else rebuilt by finish.
func (s *Server) relay(req *dns.Msg, wire []byte, tcp bool) []byte {
	binary.BigEndian.PutUint16(wire, req.Id)
	limit := maxSize(req, tcp)
	opt := trailingOPT(wire)
	switch {
	case opt < 0:
	case req.IsEdns0() != nil && len(wire) <= limit:
		return wire
	case req.IsEdns0() == nil && opt <= limit:
		wire = wire[:opt]
		binary.BigEndian.PutUint16(wire[10:], binary.BigEndian.Uint16(wire[10:])-1)
		return wire
	}
	resp := new(dns.Msg)
	if err := resp.Unpack(wire); err != nil {
		s.log.Debug("unpack upstream reply", "error", err)
		resp = rcodeReply(req, dns.RcodeServerFailure)
	}
	return s.finish(req, resp, tcp)
}

// localUDPSize is the EDNS0 size dns-proxy advertises in its replies.
const localUDPSize = 1232

// matchEDNS gives resp an OPT record exactly when req has one.
func matchEDNS(req, resp *dns.Msg) {
	if req.IsEdns0() == nil {
		resp.Extra = removeOPT(resp.Extra)
		return
	}
	if resp.IsEdns0() == nil {
		resp.SetEdns0(localUDPSize, false)
	}
}

func removeOPT(rrs []dns.RR) []dns.RR {
	out := rrs[:0]
	for _, rr := range rrs {
		if rr.Header().Rrtype != dns.TypeOPT {
			out = append(out, rr)
		}
	}
	return out
}

// maxSize is the largest reply the client takes: 64 KiB over TCP, else its EDNS0 size but
// at least 512 bytes.
func maxSize(req *dns.Msg, tcp bool) int {
	if tcp {
		return dns.MaxMsgSize
	}
	if o := req.IsEdns0(); o != nil && int(o.UDPSize()) > dns.MinMsgSize {
		return int(o.UDPSize())
	}
	return dns.MinMsgSize
}

// shuffled returns a copy of answers with the address records (which follow any CNAME)
// in random order, so that clients spread over the addresses.
func shuffled(answers []dns.RR) []dns.RR {
	out := append([]dns.RR(nil), answers...)
	addrs := out
	if len(out) > 0 && out[0].Header().Rrtype == dns.TypeCNAME {
		addrs = out[1:]
	}
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	return out
}

// udpReadTimeout bounds how long a blocking read waits before the reader looks for the stop.
const udpReadTimeout = 100 * time.Millisecond
