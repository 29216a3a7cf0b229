package dnsproxy

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestForwardRotatesSourcePorts: forwarded queries leave from many source ports, each socket
// serving a few queries only, not from a fixed few for the life of the process.
func TestForwardRotatesSourcePorts(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, Config{Upstreams: []string{up.addr}})
	p.SetNameTable(testNameTable())
	const n = 160
	for i := range n {
		if r := query(t, p.addr, "udp", fmt.Sprintf("fwd%d.example.net.", i), dns.TypeA, 0); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("forwarded query %d: rcode %s", i, dns.RcodeToString[r.Rcode])
		}
	}
	up.mu.Lock()
	ports, most := len(up.ports), 0
	for _, c := range up.ports {
		most = max(most, c)
	}
	up.mu.Unlock()
	if want := n / udpQueriesPerSocket; ports < want || most > udpQueriesPerSocket {
		t.Errorf("%d forwarded queries left from %d source ports, at most %d from one; want at least %d ports, at most %d queries each",
			n, ports, most, want, udpQueriesPerSocket)
	}
}

// TestForwardTimeoutRetiresSocket: a socket on which a query timed out takes no more
// queries, and closes once its pending queries are done.
func TestForwardTimeoutRetiresSocket(t *testing.T) {
	// An upstream that reads and never answers.
	silent, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	f := newForwarder([]string{silent.LocalAddr().String()}, 100*time.Millisecond, false, m)
	defer f.close()
	u := f.upstreams[0]
	q, err := newUpstreamQuery(new(dns.Msg).SetQuestion("lost.example.net.", dns.TypeA))
	if err != nil {
		t.Fatal(err)
	}
	cl := &call{question: q.question, done: make(chan result, 1)}
	c, id, err := u.udpCall(&f.readers, cl)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.exchange(ctx, q, id, cl); err == nil {
		t.Fatal("a query to a silent upstream got an answer")
	}
	if !c.worn() {
		t.Error("the socket of a timed-out query is still in service")
	}
}
