package dnsproxy

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// checkQuery answers pkt on both paths and checks that the general path never fails and
// that the fast path, when it answers, answers as the general path does. The server has
// no upstreams, so forwarded queries get SERVFAIL without leaving the process.
func checkQuery(t *testing.T, s *Server, pkt []byte) {
	t.Helper()
	var scratch fastScratch
	fast, fastOK := scratch.reply(s.table.Load(), pkt, nil)
	req, reject := unpackQuery(pkt)
	if req == nil {
		if fastOK {
			t.Fatalf("fast path answered %x, which the general path rejects", pkt)
		}
		if reject != nil {
			if _, err := reject.Pack(); err != nil {
				t.Fatalf("pack rejection of %x: %v", pkt, err)
			}
		}
		return
	}
	wire := s.reply(context.Background(), req, false)
	resp := new(dns.Msg)
	if err := resp.Unpack(wire); err != nil {
		t.Fatalf("reply to %x does not unpack: %v", pkt, err)
	}
	if len(wire) > maxSize(req, false) {
		t.Fatalf("reply to %x is %d bytes, over the client's %d", pkt, len(wire), maxSize(req, false))
	}
	if !fastOK {
		return
	}
	got := new(dns.Msg)
	if err := got.Unpack(fast); err != nil {
		t.Fatalf("fast reply to %x does not unpack: %v", pkt, err)
	}
	if len(fast) > maxSize(req, false) {
		t.Fatalf("fast reply to %x is %d bytes, over the client's %d", pkt, len(fast), maxSize(req, false))
	}
	if d := diffReplies(got, resp); d != "" {
		t.Fatalf("fast and general replies to %s differ: %s\nfast:\n%v\ngeneral:\n%v", req.Question[0].String(), d, got, resp)
	}
}

// diffReplies compares what a client sees: header, question, answers in any order, OPT.
func diffReplies(a, b *dns.Msg) string {
	switch {
	case a.MsgHdr != b.MsgHdr:
		return "headers"
	case !slices.Equal(a.Question, b.Question):
		return "questions"
	case !slices.Equal(answerStrings(a), answerStrings(b)):
		return "answers"
	case len(a.Ns) != len(b.Ns) || len(a.Extra) != len(b.Extra):
		return "authority or additional sections"
	case (a.IsEdns0() == nil) != (b.IsEdns0() == nil):
		return "OPT"
	}
	return ""
}

func newCheckServer(t testing.TB) *Server {
	s, err := NewServer(Config{Names: testNames})
	if err != nil {
		t.Fatal(err)
	}
	s.SetNameTable(testNameTable())
	return s
}

// TestFastPathMatchesGeneralPath asks every name of the table, and the name with the first
// search domain appended (a CNAME to it, answered as asked), in every form the fast path takes.
func TestFastPathMatchesGeneralPath(t *testing.T) {
	s := newCheckServer(t)
	table := s.table.Load()
	answered, cnames := 0, 0
	var names []string
	for name := range table.hosts {
		names = append(names, name, name+table.search) // the name, and its search-expanded CNAME
	}
	for _, name := range names {
		for _, qname := range []string{name, strings.ToUpper(name)} {
			for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
				for _, edns := range []uint16{0, 512, 4096} {
					for _, rd := range []bool{false, true} {
						m := new(dns.Msg)
						m.SetQuestion(qname, qtype)
						m.RecursionDesired = rd
						m.CheckingDisabled = rd
						if edns > 0 {
							m.SetEdns0(edns, false)
						}
						pkt, err := m.Pack()
						if err != nil {
							t.Fatal(err)
						}
						if _, ok := new(fastScratch).reply(table, pkt, nil); ok {
							answered++
							if table.hosts[name] == nil {
								cnames++
							}
						}
						checkQuery(t, s, pkt)
					}
				}
			}
		}
	}
	if answered == 0 || cnames == 0 {
		t.Fatalf("the fast path answered %d queries, %d of them for search-expanded CNAMEs; want some of each", answered, cnames)
	}
}

func FuzzQuery(f *testing.F) {
	for _, q := range []struct {
		name  string
		qtype uint16
		edns  uint16
	}{
		{"details.", dns.TypeA, 0},
		{"Headless.NS1.svc.cluster.local.", dns.TypeA, 1232},
		{"details.ns1.ns1.svc.cluster.local.", dns.TypeAAAA, 4096},
		{"x.wild.example.org.", dns.TypeA, 0},
		{"www.example.net.", dns.TypeTXT, 0},
	} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		if q.edns > 0 {
			m.SetEdns0(q.edns, true)
		}
		pkt, _ := m.Pack()
		f.Add(pkt)
	}
	s := newCheckServer(f)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		checkQuery(t, s, pkt)
	})
}
