package dnsproxy

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// upstream is a real DNS server on loopback (UDP and TCP on one port) standing in for the
// cluster's resolver: any name has a 198.51.100.1, nx.example.net is NXDOMAIN, and
// big.example.net has 40 A records (over 512 bytes).
type testUpstream struct {
	addr      string
	queries   atomic.Int64
	ednsSizes atomic.Int64 // the last EDNS0 size seen, 0 for none

	mu    sync.Mutex
	ports map[int]int // queries by source port (UDP)
}

const bigCount = 40

func startUpstream(t testing.TB) *testUpstream {
	t.Helper()
	u := &testUpstream{ports: map[int]int{}}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		u.queries.Add(1)
		if a, ok := w.RemoteAddr().(*net.UDPAddr); ok {
			u.mu.Lock()
			u.ports[a.Port]++
			u.mu.Unlock()
		}
		u.ednsSizes.Store(0)
		if o := r.IsEdns0(); o != nil {
			u.ednsSizes.Store(int64(o.UDPSize()))
		}
		m := new(dns.Msg)
		m.SetReply(r)
		m.RecursionAvailable = true
		q := r.Question[0]
		switch {
		case q.Name == "nx.example.net.":
			m.Rcode = dns.RcodeNameError
		case q.Name == "big.example.net." && q.Qtype == dns.TypeA:
			for i := range bigCount {
				rr, _ := dns.NewRR(fmt.Sprintf("big.example.net. 60 IN a 198.51.100.%d", i+1))
				m.Answer = append(m.Answer, rr)
			}
		case q.Qtype == dns.TypeA:
			rr, _ := dns.NewRR(q.Name + " 60 IN a 198.51.100.1")
			m.Answer = append(m.Answer, rr)
		case q.Qtype == dns.TypeTXT:
			rr, _ := dns.NewRR(q.Name + ` 60 IN TXT "from upstream"`)
			m.Answer = append(m.Answer, rr)
		}
		if o := r.IsEdns0(); o != nil {
			m.SetEdns0(o.UDPSize(), false)
		}
		w.WriteMsg(m)
	})
	pc, l := listenPair(t)
	u.addr = pc.LocalAddr().String()
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: l, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() { defer close(done); srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { srv.Shutdown(); <-done })
	}
	return u
}

// listenPair listens on UDP and TCP on the same random loopback port.
func listenPair(t testing.TB) (*net.UDPConn, net.Listener) {
	t.Helper()
	for range 20 {
		pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, l
		}
		pc.Close()
	}
	t.Fatal("no free UDP+TCP port pair on 127.0.0.1")
	return nil, nil
}

// deadAddr is a loopback UDP and TCP address nothing listens on.
func deadAddr(t *testing.T) string {
	pc, l := listenPair(t)
	addr := pc.LocalAddr().String()
	pc.Close()
	l.Close()
	return addr
}

type testProxy struct {
	*Server
	addr string
	reg  *prometheus.Registry
}

func startProxy(t *testing.T, cfg Config) *testProxy {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	if cfg.Names.Domain == "" {
		cfg.Names = testNames
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pc, l := listenPair(t)
	serveOn(t, s, pc, l)
	return &testProxy{Server: s, addr: pc.LocalAddr().String(), reg: reg}
}

func query(t *testing.T, addr, network, name string, qtype uint16, edns uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns > 0 {
		m.SetEdns0(edns, false)
	}
	c := &dns.Client{Net: network, Timeout: 10 * time.Second}
	if edns > 0 {
		c.UDPSize = edns
	}
	resp, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	return resp
}

func TestServeBeforeFirstTable(t *testing.T) {
	u := startUpstream(t)
	p := startProxy(t, Config{Upstreams: []string{u.addr}})
	if p.Ready() == nil {
		t.Error("Ready() = nil before the first table")
	}
	for _, network := range []string{"udp", "tcp"} {
		if resp := query(t, p.addr, network, "details.ns1.svc.cluster.local.", dns.TypeA, 0); resp.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s before the table: rcode %s, want SERVFAIL", network, dns.RcodeToString[resp.Rcode])
		}
	}
	if u.queries.Load() != 0 {
		t.Errorf("upstream got %d queries before the table, want 0", u.queries.Load())
	}
	p.SetNameTable(testNameTable())
	if err := p.Ready(); err != nil {
		t.Errorf("Ready() = %v after a table", err)
	}
}

func TestServeRespondBeforeSync(t *testing.T) {
	u := startUpstream(t)
	p := startProxy(t, Config{Upstreams: []string{u.addr}, RespondBeforeSync: true})
	resp := query(t, p.addr, "udp", "www.example.net.", dns.TypeA, 0)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Errorf("forwarded before the table: %v", resp)
	}
}

func TestServeAnswers(t *testing.T) {
	u := startUpstream(t)
	p := startProxy(t, Config{Upstreams: []string{u.addr}})
	p.SetNameTable(testNameTable())

	tests := []struct {
		name   string
		qtype  uint16
		rcode  int
		aa     bool
		tc     bool
		answer []string // sorted "owner type data"
	}{
		{"details.ns1.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, true, false, []string{"details.ns1.svc.cluster.local. a 10.0.0.1"}},
		{"DETAILS.ns1.Svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, true, false, []string{"details.ns1.svc.cluster.local. a 10.0.0.1"}},
		{"details.", dns.TypeA, dns.RcodeSuccess, true, false, []string{"details. a 10.0.0.1"}},
		{"details.ns1.", dns.TypeA, dns.RcodeSuccess, true, false, []string{"details.ns1. a 10.0.0.1"}},
		{"details.ns1.svc.", dns.TypeA, dns.RcodeSuccess, true, false, []string{"details.ns1.svc. a 10.0.0.1"}},
		{"details.ns1.ns1.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, true, false, []string{"details.ns1. a 10.0.0.1", "details.ns1.ns1.svc.cluster.local. cname details.ns1."}},
		{"details.", dns.TypeAAAA, dns.RcodeSuccess, true, false, []string{}},
		{"reviews.ns2.svc.cluster.local.", dns.TypeAAAA, dns.RcodeSuccess, true, false, []string{"reviews.ns2.svc.cluster.local. aaaa fd00::2"}},
		{"headless.", dns.TypeA, dns.RcodeSuccess, true, false, []string{"headless. a 10.1.0.1", "headless. a 10.1.0.2", "headless. a 10.1.0.3", "headless. a 10.1.0.4"}},
		{"x.wild.example.org.", dns.TypeA, dns.RcodeSuccess, true, false, []string{"x.wild.example.org. a 192.0.2.20"}},
		{"X.Wild.example.org.", dns.TypeAAAA, dns.RcodeSuccess, true, false, []string{"x.wild.example.org. aaaa 2001:db8::20"}},
		// Forwarded and relayed.
		{"www.example.net.", dns.TypeA, dns.RcodeSuccess, false, false, []string{"www.example.net. a 198.51.100.1"}},
		{"www.example.com.", dns.TypeTXT, dns.RcodeSuccess, false, false, []string{`www.example.com. txt "from upstream"`}},
		{"nx.example.net.", dns.TypeA, dns.RcodeNameError, false, false, []string{}},
		{"reviews.", dns.TypeA, dns.RcodeSuccess, false, false, []string{"reviews. a 198.51.100.1"}},
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, edns := range []uint16{0, 1232} {
			for _, tt := range tests {
				resp := query(t, p.addr, network, tt.name, tt.qtype, edns)
				id := fmt.Sprintf("%s %s over %s edns %d", tt.name, dns.TypeToString[tt.qtype], network, edns)
				if resp.Rcode != tt.rcode || resp.Authoritative != tt.aa || resp.Truncated != tt.tc {
					t.Errorf("%s: rcode %s aa %v tc %v, want %s %v %v", id, dns.RcodeToString[resp.Rcode], resp.Authoritative, resp.Truncated,
						dns.RcodeToString[tt.rcode], tt.aa, tt.tc)
				}
				if got := answerStrings(resp); !slices.Equal(got, tt.answer) {
					t.Errorf("%s: answer %q, want %q", id, got, tt.answer)
				}
				if (resp.IsEdns0() != nil) != (edns > 0) {
					t.Errorf("%s: reply has OPT %v, want %v", id, resp.IsEdns0() != nil, edns > 0)
				}
				if resp.Question[0].Name != tt.name {
					t.Errorf("%s: question %q, want it echoed as %q", id, resp.Question[0].Name, tt.name)
				}
			}
		}
	}
	if got := counterValue(p.metrics.requests); got != float64(4*len(tests)) {
		t.Errorf("istio_agent_dns_requests_total = %v, want %d", got, 4*len(tests))
	}
	if got := counterValue(p.metrics.upstreamRequests); got != 4*4 {
		t.Errorf("istio_agent_dns_upstream_requests_total = %v, want 16", got)
	}
}

// answerStrings renders the answer as sorted "owner type data" strings, lower-cased (an
// owner may echo the question's case).
func answerStrings(m *dns.Msg) []string {
	out := []string{}
	for _, rr := range m.Answer {
		f := strings.Fields(strings.ToLower(rr.String()))
		out = append(out, strings.Join(append([]string{f[0], f[3]}, f[4:]...), " "))
	}
	slices.Sort(out)
	return out
}

func TestServeLargeUpstreamAnswer(t *testing.T) {
	u := startUpstream(t)
	p := startProxy(t, Config{Upstreams: []string{u.addr}})
	p.SetNameTable(testNameTable())
	tests := []struct {
		network string
		edns    uint16
		tc      bool
		count   int
	}{
		{"udp", 0, true, -1}, // cut to 512 bytes, TC set: the client retries over TCP
		{"udp", 4096, false, bigCount},
		{"tcp", 0, false, bigCount},
	}
	for _, tt := range tests {
		resp := query(t, p.addr, tt.network, "big.example.net.", dns.TypeA, tt.edns)
		if resp.Rcode != dns.RcodeSuccess || resp.Truncated != tt.tc || (tt.count >= 0 && len(resp.Answer) != tt.count) {
			t.Errorf("big answer over %s edns %d: rcode %s tc %v answers %d, want NOERROR tc %v answers %d",
				tt.network, tt.edns, dns.RcodeToString[resp.Rcode], resp.Truncated, len(resp.Answer), tt.tc, tt.count)
		}
		if got := u.ednsSizes.Load(); got < upstreamUDPSize {
			t.Errorf("big answer over %s edns %d: upstream saw EDNS0 size %d, want at least %d", tt.network, tt.edns, got, upstreamUDPSize)
		}
		if tt.tc && len(resp.Answer) >= bigCount {
			t.Errorf("truncated reply kept all %d answers", len(resp.Answer))
		}
	}
}

func TestServeUpstreamFailures(t *testing.T) {
	u := startUpstream(t)
	dead := deadAddr(t)
	silent, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}) // reads nothing, answers nothing
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	tests := []struct {
		name      string
		upstreams []string
		parallel  bool
		network   string
		rcode     int
	}{
		{"refused", []string{dead}, false, "udp", dns.RcodeServerFailure},
		{"refused tcp", []string{dead}, false, "tcp", dns.RcodeServerFailure},
		{"timeout", []string{silent.LocalAddr().String()}, false, "udp", dns.RcodeServerFailure},
		{"none", nil, false, "udp", dns.RcodeServerFailure},
		{"second works", []string{dead, u.addr}, false, "udp", dns.RcodeSuccess},
		{"second works tcp", []string{dead, u.addr}, false, "tcp", dns.RcodeSuccess},
		{"parallel", []string{silent.LocalAddr().String(), dead, u.addr}, true, "udp", dns.RcodeSuccess},
		{"parallel all fail", []string{dead, silent.LocalAddr().String()}, true, "udp", dns.RcodeServerFailure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startProxy(t, Config{Upstreams: tt.upstreams, ForwardParallel: tt.parallel, ForwardTimeout: 300 * time.Millisecond})
			p.SetNameTable(testNameTable())
			for range 3 { // shuffled order: try a few times
				resp := query(t, p.addr, tt.network, "www.example.net.", dns.TypeA, 0)
				if resp.Rcode != tt.rcode {
					t.Fatalf("rcode %s, want %s", dns.RcodeToString[resp.Rcode], dns.RcodeToString[tt.rcode])
				}
			}
			wantFailures := 0.0
			if tt.rcode == dns.RcodeServerFailure {
				wantFailures = 3
			}
			if got := counterValue(p.metrics.upstreamFailures); got != wantFailures {
				t.Errorf("istio_agent_dns_upstream_failures_total = %v, want %v", got, wantFailures)
			}
		})
	}
}

func TestServeTableUpdate(t *testing.T) {
	p := startProxy(t, Config{})
	p.SetNameTable(testNameTable())
	for i := range 5 {
		ip := fmt.Sprintf("10.9.0.%d", i+1)
		p.SetNameTable(&ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
			"details.ns1.svc.cluster.local": kube("details", "ns1", ip),
		}})
		for _, network := range []string{"udp", "tcp"} {
			resp := query(t, p.addr, network, "details.", dns.TypeA, 0)
			if got := answerStrings(resp); !slices.Equal(got, []string{"details. a " + ip}) {
				t.Errorf("after update %d over %s: %q, want details. A %s", i, network, got, ip)
			}
		}
	}
}

func TestServeMalformedPackets(t *testing.T) {
	p := startProxy(t, Config{})
	p.SetNameTable(testNameTable())
	conn, err := net.Dial("udp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	good := new(dns.Msg).SetQuestion("details.", dns.TypeA)
	goodWire, _ := good.Pack()
	response := new(dns.Msg).SetQuestion("details.", dns.TypeA)
	response.Response = true
	responseWire, _ := response.Pack()
	packets := [][]byte{
		{},
		{0x12},
		goodWire[:12],                        // header only: FORMERR
		goodWire[:len(goodWire)-2],           // cut question
		append(goodWire[:12:12], 0xc0, 0x0c), // a pointer loop
		responseWire,                         // a response, not a query: ignored
		append(append([]byte{}, goodWire...), 0xff, 0xff, 0xff),
	}
	for _, pkt := range packets {
		if _, err := conn.Write(pkt); err != nil {
			t.Fatal(err)
		}
	}
	// The server still answers, over both transports.
	for _, network := range []string{"udp", "tcp"} {
		if got := answerStrings(query(t, p.addr, network, "details.", dns.TypeA, 0)); !slices.Equal(got, []string{"details. a 10.0.0.1"}) {
			t.Errorf("after malformed packets over %s: %q", network, got)
		}
	}
}

func TestServeShufflesAddresses(t *testing.T) {
	p := startProxy(t, Config{})
	p.SetNameTable(testNameTable())
	firsts := map[string]bool{}
	for range 64 {
		resp := query(t, p.addr, "udp", "headless.ns1.svc.cluster.local.", dns.TypeA, 0)
		firsts[resp.Answer[0].(*dns.A).A.String()] = true
	}
	if len(firsts) < 2 {
		t.Errorf("64 answers all started with %v: not shuffled", firsts)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// TestServeStopsUnderLoad: Serve returns promptly when asked to stop while queries keep
// coming, also after another holder of the socket (agentd starting a child takes File.Fd)
// turned it to blocking mode.
func TestServeStopsUnderLoad(t *testing.T) {
	s, err := NewServer(Config{Names: testNames})
	if err != nil {
		t.Fatal(err)
	}
	s.SetNameTable(testNameTable())
	pc, l := listenPair(t)
	f, err := pc.File() // what agentd's exec does: the socket becomes blocking
	if err != nil {
		t.Fatal(err)
	}
	f.Fd()
	defer f.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, []net.PacketConn{pc}, []net.Listener{l}) }()

	stop := make(chan struct{})
	var senders sync.WaitGroup
	for range 4 {
		senders.Go(func() {
			c, err := net.Dial("udp", pc.LocalAddr().String())
			if err != nil {
				return
			}
			defer c.Close()
			q, _ := new(dns.Msg).SetQuestion("details.", dns.TypeA).Pack()
			buf := make([]byte, 512)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.Write(q)
				c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				c.Read(buf)
			}
		})
	}
	defer func() { close(stop); senders.Wait() }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve() = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return within 10 s of the stop under load")
	}
}

// serveOn runs s on pc and l until the test ends.
func serveOn(t *testing.T, s *Server, pc net.PacketConn, l net.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, []net.PacketConn{pc}, []net.Listener{l}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve() = %v", err)
		}
	})
}

// tableServer returns a server with the test name table, forwarding to a test upstream.
func tableServer(t *testing.T) *Server {
	t.Helper()
	u := startUpstream(t)
	s, err := NewServer(Config{Names: testNames, Upstreams: []string{u.addr}})
	if err != nil {
		t.Fatal(err)
	}
	s.SetNameTable(testNameTable())
	return s
}

// TestServeNonBlockingSocket: another holder of the socket can leave it in non-blocking mode
// (the next dns-proxy of a swap does, for a moment, as net.FilePacketConn wraps it); the
// reader of the process still serving keeps answering.
func TestServeNonBlockingSocket(t *testing.T) {
	s := tableServer(t)
	pc, l := listenPair(t)
	addr := pc.LocalAddr().String()
	f, err := pc.File() // another holder of the socket
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	serveOn(t, s, pc, l)
	query(t, addr, "udp", "details.", dns.TypeA, 0) // the reader has the socket
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetNonblock(int(fd), true) }); err != nil || serr != nil {
		t.Fatalf("set non-blocking: %v %v", err, serr)
	}
	for range 3 {
		if got := answerStrings(query(t, addr, "udp", "details.", dns.TypeA, 0)); !slices.Equal(got, []string{"details. a 10.0.0.1"}) {
			t.Errorf("table hit on a non-blocking socket: %q", got)
		}
		if got := answerStrings(query(t, addr, "udp", "www.example.net.", dns.TypeA, 0)); !slices.Equal(got, []string{"www.example.net. a 198.51.100.1"}) {
			t.Errorf("forwarded on a non-blocking socket: %q", got)
		}
		time.Sleep(udpReadTimeout) // the reader waits again
	}
}

// TestServeIPv6 answers on ::1, on the fast and the general path.
func TestServeIPv6(t *testing.T) {
	s := tableServer(t)
	pc, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	serveOn(t, s, pc, l)
	if got := answerStrings(query(t, addr, "udp", "details.", dns.TypeA, 0)); !slices.Equal(got, []string{"details. a 10.0.0.1"}) {
		t.Errorf("table hit over IPv6: %q", got)
	}
	if got := answerStrings(query(t, addr, "udp", "www.example.net.", dns.TypeA, 0)); !slices.Equal(got, []string{"www.example.net. a 198.51.100.1"}) {
		t.Errorf("forwarded over IPv6: %q", got)
	}
}

// TestServeCancelledAtOnce: a Serve whose context ends before its TCP server has started
// returns (miekg's Shutdown refuses a server not started yet, which then served forever: a
// test's cleanup hung 10 minutes on a loaded machine).
func TestServeCancelledAtOnce(t *testing.T) {
	s := tableServer(t)
	for range 20 {
		pc, l := listenPair(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		done := make(chan error, 1)
		go func() { done <- s.Serve(ctx, []net.PacketConn{pc}, []net.Listener{l}) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Serve() = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Serve still running 10 s after its context ended")
		}
	}
}
