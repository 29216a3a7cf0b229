package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"

	"github.com/agentd/agentd/internal/testing/logbuf"

	"github.com/miekg/dns"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/agent"
	"github.com/agentd/agentd/internal/control"
	"github.com/agentd/agentd/internal/supervisor"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// freeDNSAddr returns a loopback address whose port was free for both UDP and TCP.
func freeDNSAddr(t *testing.T) string {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		pc, err := net.ListenPacket("udp", addr)
		l.Close()
		if err == nil {
			pc.Close()
			return addr
		}
	}
	t.Fatal("no port free for both UDP and TCP")
	return ""
}

// startDnsmasq runs dnsmasq on loopback as the cluster's resolver: the hosts lines, TXT
// records, NXDOMAIN for every other example.net and cluster.local name, REFUSED for other
// names. Its answers from the hosts file are authoritative. It returns its address.
func startDnsmasq(t *testing.T, hosts string, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	hostsFile := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hostsFile, []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeDNSAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	args := append([]string{"--keep-in-foreground", "--no-resolv", "--no-hosts", "--addn-hosts=" + hostsFile,
		"--listen-address=127.0.0.1", "--bind-interfaces", "--port=" + port, "--conf-file=/dev/null",
		"--user=root", "--pid-file=", "--cache-size=1000", "--local=/example.net/", "--local=/cluster.local/"}, extra...)
	cmd := exec.Command("dnsmasq", args...)
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start dnsmasq: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("dnsmasq output:\n%s", out)
		}
	})
	waitFor(t, "dnsmasq", func() bool {
		m := new(dns.Msg).SetQuestion("www.example.net.", dns.TypeA)
		_, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, addr)
		return err == nil
	})
	return addr
}

// dnsAgent is an agentd with DNS capture on, dns-proxy on its own address, and dnsmasq as
// its upstream.
type dnsAgent struct {
	*Agentd
	addr string // dns-proxy's address
}

const bigCount = 40

func startDNSAgent(t *testing.T, env ...string) *dnsAgent {
	t.Helper()
	hosts := "198.51.100.1 www.example.net\n"
	for i := range bigCount {
		hosts += fmt.Sprintf("198.51.100.%d big.example.net\n", 100+i)
	}
	upstream := startDnsmasq(t, hosts, "--txt-record=details.ns1.svc.cluster.local,from upstream")
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+upstream+"\nsearch ns1.svc.cluster.local svc.cluster.local cluster.local\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeDNSAddr(t)
	env = append([]string{"ISTIO_META_DNS_CAPTURE=true", "POD_NAMESPACE=ns1"}, env...)
	// A short ready timeout: children start one after the other, and sds-server, first, is
	// not ready without a CA; dns-proxy must not wait 30 s behind it.
	a := startAgentd(t, env, "--disable-envoy", "--dns-address", addr, "--resolv-conf", resolv, "--ready-timeout", "5s")
	return &dnsAgent{Agentd: a, addr: addr}
}

// dnsProxy waits until dns-proxy's status satisfies cond and returns it.
func (a *dnsAgent) dnsProxy(t *testing.T, what string, cond func(supervisor.Status) bool) supervisor.Status {
	t.Helper()
	var got supervisor.Status
	waitFor(t, what, func() bool {
		st, err := a.Status()
		if err != nil {
			return false
		}
		for _, c := range st.Children {
			if c.Name == "dns-proxy" {
				got = c
				return cond(c)
			}
		}
		return false
	})
	return got
}

func started(s supervisor.Status) bool { return s.Pid != 0 }
func serving(s supervisor.Status) bool { return s.State == supervisor.Running }

// publishTable publishes a name table on agentd's bus through its control socket, as
// xds-proxy does when istiod sends one.
func (a *dnsAgent) publishTable(t *testing.T, nt *ndsv1.NameTable) {
	t.Helper()
	payload, err := anypb.New(nt)
	if err != nil {
		t.Fatal(err)
	}
	js, err := protojson.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := control.NewClient(agent.ControlSocket(a.Root)).Publish(ctx, agentv1.TopicNameTable, js); err != nil {
		t.Fatalf("publish name table: %v", err)
	}
}

func svc(short, ns string, ips ...string) *ndsv1.NameTable_NameInfo {
	return &ndsv1.NameTable_NameInfo{Ips: ips, Registry: "Kubernetes", Shortname: short, Namespace: ns}
}

func meshTable(detailsIP string) *ndsv1.NameTable {
	return &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
		"details.ns1.svc.cluster.local": svc("details", "ns1", detailsIP),
		"reviews.ns2.svc.cluster.local": svc("reviews", "ns2", "10.0.0.2", "fd00::2"),
		"www.example.com":               {Ips: []string{"192.0.2.10"}, Registry: "External"},
		"*.wild.example.org":            {Ips: []string{"192.0.2.20"}, Registry: "External"},
	}}
}

// digReply is what dig printed: the status, the header flags and the answer records as
// "owner type data", lower-cased and sorted.
type digReply struct {
	status  string
	flags   []string
	answers []string
	raw     string
}

func (r digReply) flag(f string) bool { return slices.Contains(r.flags, f) }

// dig runs dig against addr with args and parses its output.
func dig(t *testing.T, addr string, args ...string) digReply {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	full := append([]string{"@" + host, "-p", port, "+tries=1", "+time=20", "+noall", "+comments", "+answer"}, args...)
	out, err := exec.Command("dig", full...).CombinedOutput()
	r := digReply{raw: string(out), answers: []string{}}
	if err != nil {
		t.Fatalf("dig %v: %v\n%s", args, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, ";; ->>HEADER<<-"):
			_, rest, _ := strings.Cut(line, "status: ")
			r.status, _, _ = strings.Cut(rest, ",")
		case strings.HasPrefix(line, ";; flags:"):
			flags, _, _ := strings.Cut(strings.TrimPrefix(line, ";; flags:"), ";")
			r.flags = strings.Fields(flags)
		case line != "" && !strings.HasPrefix(line, ";"):
			f := strings.Fields(strings.ToLower(line))
			if len(f) >= 5 {
				r.answers = append(r.answers, strings.Join(append([]string{f[0], f[3]}, f[4:]...), " "))
			}
		}
	}
	slices.Sort(r.answers)
	return r
}

// TestDNSThroughAgentd asks dns-proxy, run by `agentd run`, with dig over its real sockets.
func TestDNSThroughAgentd(t *testing.T) {
	a := startDNSAgent(t)

	// Before the first name table: SERVFAIL, and dns-proxy is not ready (Istio's rule). The
	// query waits in agentd's socket until dns-proxy starts.
	if r := dig(t, a.addr, "details.ns1.svc.cluster.local", "A"); r.status != "SERVFAIL" {
		t.Errorf("before the first table: status %s, want SERVFAIL\n%s", r.status, r.raw)
	}
	if st, err := a.Status(); err != nil || st.Ready {
		t.Errorf("agentd ready = %v (%v) before the first name table, want not ready", st.Ready, err)
	}
	a.publishTable(t, meshTable("10.0.0.1"))
	a.WaitReady() // dns-proxy with its first table

	tests := []struct {
		args    []string
		status  string
		aa, tc  bool
		answers []string
	}{
		{[]string{"details.ns1.svc.cluster.local", "A"}, "NOERROR", true, false, []string{"details.ns1.svc.cluster.local. a 10.0.0.1"}},
		{[]string{"details.ns1.svc", "A"}, "NOERROR", true, false, []string{"details.ns1.svc. a 10.0.0.1"}},
		{[]string{"details.ns1", "A"}, "NOERROR", true, false, []string{"details.ns1. a 10.0.0.1"}},
		{[]string{"details", "A"}, "NOERROR", true, false, []string{"details. a 10.0.0.1"}},
		{[]string{"DeTaiLs.NS1.svc.cluster.local", "A"}, "NOERROR", true, false, []string{"details.ns1.svc.cluster.local. a 10.0.0.1"}},
		// The search-domain short-cut: the resolver's first expansion of "details.ns1".
		{[]string{"details.ns1.ns1.svc.cluster.local", "A"}, "NOERROR", true, false, []string{
			"details.ns1. a 10.0.0.1", "details.ns1.ns1.svc.cluster.local. cname details.ns1."}},
		{[]string{"reviews.ns2.svc.cluster.local", "AAAA"}, "NOERROR", true, false, []string{"reviews.ns2.svc.cluster.local. aaaa fd00::2"}},
		{[]string{"reviews.ns2", "A"}, "NOERROR", true, false, []string{"reviews.ns2. a 10.0.0.2"}},
		{[]string{"details.ns1.svc.cluster.local", "AAAA"}, "NOERROR", true, false, []string{}}, // NODATA, not NXDOMAIN
		{[]string{"foo.wild.example.org", "A"}, "NOERROR", true, false, []string{"foo.wild.example.org. a 192.0.2.20"}},
		{[]string{"www.example.com", "A"}, "NOERROR", true, false, []string{"www.example.com. a 192.0.2.10"}},
		{[]string{"details.ns1.svc.cluster.local", "A", "+tcp"}, "NOERROR", true, false, []string{"details.ns1.svc.cluster.local. a 10.0.0.1"}},
		// Forwarded to dnsmasq and relayed as it answered.
		{[]string{"www.example.net", "A"}, "NOERROR", true, false, []string{"www.example.net. a 198.51.100.1"}},
		{[]string{"www.example.net", "A", "+tcp"}, "NOERROR", true, false, []string{"www.example.net. a 198.51.100.1"}},
		{[]string{"details.ns1.svc.cluster.local", "TXT"}, "NOERROR", true, false, []string{`details.ns1.svc.cluster.local. txt "from upstream"`}},
		{[]string{"details.ns1.svc.cluster.local", "TXT", "+tcp"}, "NOERROR", true, false, []string{`details.ns1.svc.cluster.local. txt "from upstream"`}},
		{[]string{"nx.example.net", "A"}, "NXDOMAIN", false, false, []string{}},
		// reviews is in ns2: neither a short name nor a name in ns1 here, so dnsmasq answers.
		{[]string{"reviews", "A"}, "REFUSED", false, false, []string{}},
		{[]string{"reviews.ns1.svc.cluster.local", "A"}, "NXDOMAIN", false, false, []string{}},
	}
	for _, tt := range tests {
		r := dig(t, a.addr, tt.args...)
		if r.status != tt.status || r.flag("aa") != tt.aa || r.flag("tc") != tt.tc || !slices.Equal(r.answers, tt.answers) {
			t.Errorf("dig %v: %s aa=%v tc=%v %q, want %s aa=%v tc=%v %q\n%s", tt.args, r.status, r.flag("aa"), r.flag("tc"), r.answers,
				tt.status, tt.aa, tt.tc, tt.answers, r.raw)
		}
	}

	// An upstream answer over 512 bytes: whole with EDNS0 or TCP, truncated without.
	for _, args := range [][]string{{"+bufsize=4096"}, {"+tcp"}} {
		if r := dig(t, a.addr, append([]string{"big.example.net", "A"}, args...)...); r.status != "NOERROR" || len(r.answers) != bigCount || r.flag("tc") {
			t.Errorf("dig big.example.net %v: %s tc=%v %d answers, want NOERROR with all %d\n%s", args, r.status, r.flag("tc"), len(r.answers), bigCount, r.raw)
		}
	}
	if r := dig(t, a.addr, "big.example.net", "A", "+noedns", "+ignore"); r.status != "NOERROR" || !r.flag("tc") || len(r.answers) >= bigCount {
		t.Errorf("dig big.example.net +noedns: %s tc=%v %d answers, want NOERROR, truncated\n%s", r.status, r.flag("tc"), len(r.answers), r.raw)
	}

	// A table update is seen by the next queries.
	a.publishTable(t, meshTable("10.0.0.9"))
	waitFor(t, "the updated table", func() bool {
		return slices.Equal(dig(t, a.addr, "details", "A").answers, []string{"details. a 10.0.0.9"})
	})

	// Malformed packets are dropped without harm: dns-proxy keeps running and answering.
	pid := a.dnsProxy(t, "dns-proxy", serving).Pid
	conn, err := net.Dial("udp", a.addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, pkt := range [][]byte{{0x01}, {0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c, 0, 1, 0, 1}, []byte(strings.Repeat("\xff", 600))} {
		conn.Write(pkt)
	}
	conn.Close()
	if r := dig(t, a.addr, "details", "A"); !slices.Equal(r.answers, []string{"details. a 10.0.0.9"}) {
		t.Errorf("after malformed packets: %q\n%s", r.answers, r.raw)
	}
	if now := a.dnsProxy(t, "dns-proxy", started).Pid; now != pid {
		t.Errorf("dns-proxy restarted (pid %d → %d) after malformed packets", pid, now)
	}
}

// load sends UDP queries for details. from a few goroutines until stopped, each query on its
// own socket with one long timeout and no retry, so a lost query shows as a timeout.
type load struct {
	addr string
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	results []loadResult
}

type loadResult struct {
	sent   time.Time
	answer string // the A record's address, or the rcode, or the error
}

func startLoad(addr string, workers int) *load {
	l := &load{addr: addr, stop: make(chan struct{})}
	for range workers {
		l.wg.Go(func() {
			c := &dns.Client{Timeout: 5 * time.Second}
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				m := new(dns.Msg).SetQuestion("details.", dns.TypeA)
				r := loadResult{sent: time.Now()}
				resp, _, err := c.Exchange(m, l.addr)
				switch {
				case err != nil:
					r.answer = "error: " + err.Error()
				case resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1:
					r.answer = dns.RcodeToString[resp.Rcode] + " with " + strconv.Itoa(len(resp.Answer)) + " answers"
				default:
					r.answer = resp.Answer[0].(*dns.A).A.String()
				}
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	return l
}

func (l *load) finish() []loadResult {
	close(l.stop)
	l.wg.Wait()
	return l.results
}

// TestDNSKillNine: kill -9 of dns-proxy while queries keep coming. The socket is agentd's, so
// the queries sent while dns-proxy is down wait in it and are answered once it is back, and
// the restarted dns-proxy answers its first query from the current table (published while it
// was down), never SERVFAIL. Only queries the killed process had already read (at most one
// batch of 8) die with it.
//
// agentd is frozen with SIGSTOP around the kill, so it cannot restart dns-proxy before the
// test has sent its burst: the burst is sent while no dns-proxy exists, whatever the
// machine's speed.
func TestDNSKillNine(t *testing.T) {
	a := startDNSAgent(t)
	a.publishTable(t, meshTable("10.0.0.1"))
	old := a.dnsProxy(t, "dns-proxy ready", serving).Pid

	l := startLoad(a.addr, 4)
	time.Sleep(200 * time.Millisecond)
	if err := syscall.Kill(a.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(a.Pid(), syscall.SIGCONT) })
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitFor(t, "every thread of the killed dns-proxy to be gone", func() bool { return processGone(old) })
	burst := sendBurst(t, a.addr, 20)
	if err := syscall.Kill(a.Pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	a.publishTable(t, meshTable("10.0.0.2"))
	published := time.Now()
	a.dnsProxy(t, "dns-proxy restarted and ready", func(s supervisor.Status) bool { return s.Pid != old && serving(s) })
	for id, answer := range burst.answers(t) {
		if answer != "10.0.0.1" && answer != "10.0.0.2" {
			t.Errorf("query %d sent while dns-proxy was down: %s", id, answer)
		}
	}
	time.Sleep(200 * time.Millisecond)
	results := l.finish()

	var afterPublish, inHand int
	for _, r := range results {
		if r.answer != "10.0.0.1" && r.answer != "10.0.0.2" {
			if r.sent.Before(killed) {
				inHand++ // read by the killed process before it could answer: lost with it
				continue
			}
			t.Errorf("query sent %v after the kill: %s", r.sent.Sub(killed), r.answer)
		}
		if r.sent.After(published) && r.answer != "10.0.0.2" {
			afterPublish++
		}
	}
	t.Logf("%d queries under load and %d sent while dns-proxy was down, %d lost with the killed process", len(results), len(burst.ids), inHand)
	if inHand > 8 { // one read batch
		t.Errorf("%d queries sent before the kill were lost, more than the one batch a process holds", inHand)
	}
	if afterPublish > 0 {
		t.Errorf("%d queries sent after the new table was published were answered from the old one", afterPublish)
	}
}

// processGone reports whether every thread of pid has exited: no such process, or a zombie
// (agentd, frozen, cannot reap it) with no thread left but its leader. The leader turns
// zombie before the other threads are gone, and a thread woken by the SIGKILL in recvmmsg
// still takes a datagram that arrives meanwhile: the test must not send before that.
func processGone(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses and may hold spaces.
	state := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))[0]
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	return state == "Z" && err == nil && len(tasks) <= 1
}

// burst is a set of queries sent at once from one socket without waiting for answers.
type burst struct {
	conn *dns.Conn
	ids  map[uint16]bool
}

func sendBurst(t *testing.T, addr string, n int) *burst {
	t.Helper()
	conn, err := dns.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	b := &burst{conn: conn, ids: map[uint16]bool{}}
	for i := range n {
		m := new(dns.Msg).SetQuestion("details.", dns.TypeA)
		m.Id = uint16(1000 + i)
		if err := conn.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		b.ids[m.Id] = true
	}
	return b
}

// answers reads the answer to every query of the burst: the A record's address by query id.
func (b *burst) answers(t *testing.T) map[uint16]string {
	t.Helper()
	got := map[uint16]string{}
	b.conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	for len(got) < len(b.ids) {
		r, err := b.conn.ReadMsg()
		if err != nil {
			t.Fatalf("%d of %d answers to the queries sent while dns-proxy was down: %v", len(got), len(b.ids), err)
		}
		if !b.ids[r.Id] {
			t.Fatalf("answer with unknown id %d", r.Id)
		}
		switch {
		case r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1:
			got[r.Id] = dns.RcodeToString[r.Rcode] + " with " + strconv.Itoa(len(r.Answer)) + " answers"
		default:
			got[r.Id] = r.Answer[0].(*dns.A).A.String()
		}
	}
	return got
}

// TestDNSSwapLosesNothing: `agentd swap dns-proxy` under load loses no query.
func TestDNSSwapLosesNothing(t *testing.T) {
	a := startDNSAgent(t)
	a.publishTable(t, meshTable("10.0.0.1"))
	a.dnsProxy(t, "dns-proxy ready", serving)
	data, err := os.ReadFile(bin("dns-proxy"))
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(t.TempDir(), "dns-proxy")
	if err := os.WriteFile(copyPath, data, 0o755); err != nil {
		t.Fatal(err)
	}
	l := startLoad(a.addr, 4)
	time.Sleep(200 * time.Millisecond)
	if out, err := a.CLI("swap", "dns-proxy", "--binary", copyPath); err != nil {
		t.Fatalf("agentd swap: %v\n%s", err, out)
	}
	time.Sleep(200 * time.Millisecond)
	results := l.finish()
	for _, r := range results {
		if r.answer != "10.0.0.1" {
			t.Errorf("query during the swap: %s", r.answer)
		}
	}
	t.Logf("%d queries during the swap, all answered", len(results))
}
