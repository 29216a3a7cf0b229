package dnsproxy

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// bigNameTable has n Kubernetes services in 10 namespaces, each with one IPv4 VIP.
func bigNameTable(n int) *ndsv1.NameTable {
	nt := &ndsv1.NameTable{Table: make(map[string]*ndsv1.NameTable_NameInfo, n)}
	for i := range n {
		ns := fmt.Sprintf("ns%d", i%10)
		short := fmt.Sprintf("svc%d", i)
		nt.Table[short+"."+ns+".svc.cluster.local"] = kube(short, ns, fmt.Sprintf("10.%d.%d.%d", i>>16&0xff, i>>8&0xff, i&0xff))
	}
	return nt
}

func packQuery(b *testing.B, name string, qtype uint16) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	pkt, err := m.Pack()
	if err != nil {
		b.Fatal(err)
	}
	return pkt
}

// BenchmarkNewTable10k is the build of a 10 000-service table, off the read path, and the
// memory the table keeps (table-MB: heap in use after a collection, table built minus none).
func BenchmarkNewTable10k(b *testing.B) {
	nt := bigNameTable(10000)
	var t *Table
	for b.Loop() {
		t = NewTable(nt, testNames)
	}
	b.StopTimer()
	kept := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	with := kept()
	names := t.Len()
	t = nil
	b.ReportMetric(float64(with-kept())/1e6, "table-MB")
	b.ReportMetric(float64(names), "names")
}

// BenchmarkFastPath is the in-process cost of a table hit on the fast path: a name of the
// table, and a search-expanded CNAME to one (a resolver's first try with ndots:5).
func BenchmarkFastPath(b *testing.B) {
	t := NewTable(bigNameTable(10000), testNames)
	for _, bc := range []struct{ name, qname string }{
		{"name", "svc1231.ns1.svc.cluster.local."},
		{"search-CNAME", "svc1231.ns1.ns1.svc.cluster.local."},
	} {
		b.Run(bc.name, func(b *testing.B) {
			pkt := packQuery(b, bc.qname, dns.TypeA)
			var f fastScratch
			out := make([]byte, 0, 512)
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := f.reply(t, pkt, out[:0]); !ok {
					b.Fatal("not answered on the fast path")
				}
			}
		})
	}
}

// BenchmarkGeneralPath is the same hit on the general path (unpack, lookup, pack).
func BenchmarkGeneralPath(b *testing.B) {
	s, err := NewServer(Config{Names: testNames})
	if err != nil {
		b.Fatal(err)
	}
	s.SetNameTable(bigNameTable(10000))
	pkt := packQuery(b, "svc1231.ns1.svc.cluster.local.", dns.TypeA)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		req, _ := unpackQuery(pkt)
		if len(s.reply(ctx, req, false)) == 0 {
			b.Fatal("no reply")
		}
	}
}

// BenchmarkServeUDP measures round trips over loopback: table hits and forwarded names,
// without and with the journal (the queries in hand kept in a memfd, as agentd hands one down).
func BenchmarkServeUDP(b *testing.B) {
	u := startUpstream(b)
	for _, bc := range []struct {
		label, name string
		journal     bool
	}{
		{"hit", "svc1231.ns1.svc.cluster.local.", false},
		{"hit-journal", "svc1231.ns1.svc.cluster.local.", true},
		{"forwarded", "www.example.net.", false},
		{"forwarded-journal", "www.example.net.", true},
	} {
		b.Run(bc.label, func(b *testing.B) {
			var journal *os.File
			if bc.journal {
				fd, err := unix.MemfdCreate("bench-journal", unix.MFD_CLOEXEC)
				if err != nil {
					b.Fatal(err)
				}
				journal = os.NewFile(uintptr(fd), "bench-journal")
				defer journal.Close()
			}
			p := startBenchProxy(b, u.addr, journal)
			pkt := packQuery(b, bc.name, dns.TypeA)
			b.RunParallel(func(pb *testing.PB) {
				conn, err := net.Dial("udp", p)
				if err != nil {
					b.Error(err)
					return
				}
				defer conn.Close()
				buf := make([]byte, 1500)
				for pb.Next() {
					if _, err := conn.Write(pkt); err != nil {
						b.Error(err)
						return
					}
					if _, err := conn.Read(buf); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func startBenchProxy(b *testing.B, upstream string, journal *os.File) string {
	s, err := NewServer(Config{Names: testNames, Upstreams: []string{upstream}, Journal: journal})
	if err != nil {
		b.Fatal(err)
	}
	s.SetNameTable(bigNameTable(10000))
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(ctx, []net.PacketConn{pc}, nil) }()
	b.Cleanup(func() { cancel(); <-done })
	return pc.LocalAddr().String()
}
