package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/agentd/agentd/internal/supervisor"
)

// startSlowUpstream serves every A query with 198.51.100.7 after delay, on a loopback UDP port.
func startSlowUpstream(t *testing.T, delay time.Duration) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		time.Sleep(delay)
		m := new(dns.Msg).SetReply(r)
		if len(r.Question) == 1 && r.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 198.51.100.7")
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	done := make(chan struct{})
	go func() { defer close(done); srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { srv.Shutdown(); <-done })
	return pc.LocalAddr().String()
}

// TestDNSKillNineLosesNothing: kill -9 of dns-proxy, again and again, while clients query mesh
// names and forwarded names whose upstream takes 300 ms: at every kill the process holds
// forwarded queries. Each client sends each query once, with a resolver's 5 s timeout and no
// retry: every query gets its right answer. The queries the killed process held are in
// agentd's memory (the journal) and the next process answers them.
func TestDNSKillNineLosesNothing(t *testing.T) {
	upstream := startSlowUpstream(t, 300*time.Millisecond)
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+upstream+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeDNSAddr(t)
	a := &dnsAgent{Agentd: startAgentd(t, []string{"ISTIO_META_DNS_CAPTURE=true", "POD_NAMESPACE=ns1"},
		"--disable-envoy", "--dns-address", addr, "--resolv-conf", resolv, "--ready-timeout", "5s"), addr: addr}
	a.publishTable(t, meshTable("10.0.0.1"))
	a.dnsProxy(t, "dns-proxy ready", serving)

	type outcome struct {
		name, answer string
	}
	var mu sync.Mutex
	var results []outcome
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			c := &dns.Client{Timeout: 5 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name, want := "details.", "10.0.0.1"
				if w%2 == 1 {
					name, want = fmt.Sprintf("fwd%d-%d.example.net.", w, i), "198.51.100.7"
				}
				resp, _, err := c.Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), addr)
				got := ""
				switch {
				case err != nil:
					got = err.Error()
				case len(resp.Answer) == 1:
					if rr, ok := resp.Answer[0].(*dns.A); ok {
						got = rr.A.String()
					}
				default:
					got = dns.RcodeToString[resp.Rcode]
				}
				if got == want {
					got = ""
				}
				mu.Lock()
				results = append(results, outcome{name, got})
				mu.Unlock()
			}
		})
	}
	const kills = 5
	for range kills {
		time.Sleep(700 * time.Millisecond)
		pid := a.dnsProxy(t, "dns-proxy running", func(s supervisor.Status) bool { return serving(s) && alive(s.Pid) }).Pid
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		a.dnsProxy(t, "dns-proxy back", func(s supervisor.Status) bool { return s.Pid != pid && serving(s) })
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	lost := 0
	for _, r := range results {
		if r.answer != "" {
			lost++
			if lost <= 10 {
				t.Errorf("%s: %s", r.name, r.answer)
			}
		}
	}
	t.Logf("%d queries, %d kills of dns-proxy, %d without their right answer", len(results), kills, lost)
}
