package dnsproxy

import (
	"encoding/binary"
	"testing"

	"github.com/miekg/dns"
)

func packed(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTrailingOPT(t *testing.T) {
	plain := new(dns.Msg).SetQuestion("www.example.net.", dns.TypeA)
	plain.Response = true
	a, _ := dns.NewRR("www.example.net. 60 IN A 198.51.100.1")
	plain.Answer = []dns.RR{a}
	withOPT := plain.Copy().SetEdns0(1232, false)
	optFirst := withOPT.Copy()
	txt, _ := dns.NewRR(`www.example.net. 60 IN TXT "x"`)
	optFirst.Extra = append(optFirst.Extra, txt)

	tests := []struct {
		name string
		wire []byte
		want int // -1: none
	}{
		{"no OPT", packed(t, plain), -1},
		{"OPT last", packed(t, withOPT), len(packed(t, withOPT)) - 11},
		{"OPT not last", packed(t, optFirst), -1},
		{"cut", packed(t, withOPT)[:30], -1},
		{"trailing garbage", append(packed(t, withOPT), 0), -1},
		{"short", []byte{1, 2, 3}, -1},
	}
	for _, tt := range tests {
		if got := trailingOPT(tt.wire); got != tt.want {
			t.Errorf("trailingOPT(%s) = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// FuzzRelay feeds arbitrary upstream replies to relay: whatever comes back carries the
// client's ID, has a question section, and fits what the client takes.
func FuzzRelay(f *testing.F) {
	reply := new(dns.Msg).SetQuestion("www.example.net.", dns.TypeA)
	reply.Response = true
	for i := range 40 {
		rr, _ := dns.NewRR("www.example.net. 60 IN A 198.51.100." + string(rune('0'+i%10)))
		reply.Answer = append(reply.Answer, rr)
	}
	f.Add(packed(f, reply), false)
	f.Add(packed(f, reply.Copy().SetEdns0(1232, false)), true)
	s := newCheckServer(f)
	f.Fuzz(func(t *testing.T, wire []byte, edns bool) {
		req := new(dns.Msg).SetQuestion("www.example.net.", dns.TypeA)
		req.Id = 0x4242
		if edns {
			req.SetEdns0(600, false)
		}
		if len(wire) < 12 {
			return // forward never returns these
		}
		out := s.relay(req, append([]byte(nil), wire...), false)
		if len(out) > maxSize(req, false) || len(out) < 12 || binary.BigEndian.Uint16(out) != req.Id || questionEnd(out) < 0 {
			t.Fatalf("relay(%x) = %x: over %d bytes, wrong ID or no question", wire, out, maxSize(req, false))
		}
	})
}

func TestRelayMatchesGeneralPath(t *testing.T) {
	s := newCheckServer(t)
	for _, edns := range []bool{false, true} {
		for _, count := range []int{1, 40} {
			req := new(dns.Msg).SetQuestion("www.example.net.", dns.TypeA)
			if edns {
				req.SetEdns0(1232, false)
			}
			up := new(dns.Msg).SetReply(req)
			for range count {
				rr, _ := dns.NewRR("www.example.net. 60 IN A 198.51.100.1")
				up.Answer = append(up.Answer, rr)
			}
			up.SetEdns0(1232, false) // the upstream answers dns-proxy's OPT
			got := new(dns.Msg)
			if err := got.Unpack(s.relay(req, packed(t, up), false)); err != nil {
				t.Fatal(err)
			}
			want := new(dns.Msg)
			if err := want.Unpack(s.finish(req, up, false)); err != nil {
				t.Fatal(err)
			}
			if d := diffReplies(got, want); d != "" || got.Truncated != want.Truncated {
				t.Errorf("edns %v, %d answers: relay and finish differ in %s (tc %v, %v)", edns, count, d, got.Truncated, want.Truncated)
			}
		}
	}
}
