package dnsproxy

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/agentd/agentd/internal/bus"
	"github.com/agentd/agentd/internal/component"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// testBus is agentd's bus served over gRPC on a Unix socket, as agentd serves it to helpers.
type testBus struct {
	broker *bus.Broker
	path   string
	stop   func()
}

func startBus(t *testing.T, broker *bus.Broker, path string) *testBus {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	agentv1.RegisterBusServer(gs, broker.Server())
	done := make(chan struct{})
	go func() { defer close(done); gs.Serve(l) }()
	b := &testBus{broker: broker, path: path, stop: func() { gs.Stop(); <-done }}
	t.Cleanup(b.stop)
	return b
}

func (b *testBus) client(t *testing.T) *component.Bus {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+b.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return component.NewBus(agentv1.NewBusClient(conn))
}

func (b *testBus) publish(t *testing.T, nt *ndsv1.NameTable) {
	t.Helper()
	payload, err := anypb.New(nt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.broker.Publish(agentv1.TopicNameTable, payload); err != nil {
		t.Fatal(err)
	}
}

func oneService(ip string) *ndsv1.NameTable {
	return &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{"details.ns1.svc.cluster.local": kube("details", "ns1", ip)}}
}

// runHelper runs a helper on the sockets until the returned stop is called.
func runHelper(t *testing.T, cfg Config, b *component.Bus, pc net.PacketConn, l net.Listener) (*Helper, func()) {
	t.Helper()
	h, err := NewHelper(cfg, b, []net.PacketConn{pc}, []net.Listener{l})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}
	t.Cleanup(stop)
	return h, stop
}

// eventually polls cond until it holds or 10 s have passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dupSockets returns copies of the sockets' file descriptors, as a restarted helper
// inherits them from agentd.
func dupSockets(t *testing.T, pc *net.UDPConn, l net.Listener) (net.PacketConn, net.Listener) {
	t.Helper()
	pf, err := pc.File()
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	lf, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	pc2, err := net.FilePacketConn(pf)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := net.FileListener(lf)
	if err != nil {
		t.Fatal(err)
	}
	return pc2, l2
}

func TestHelperFollowsNameTable(t *testing.T) {
	b := startBus(t, bus.New(), filepath.Join(t.TempDir(), "bus.sock"))
	pc, l := listenPair(t) // agentd's sockets: they outlive every helper process
	defer pc.Close()
	defer l.Close()
	addr := pc.LocalAddr().String()
	lookup := func(network string) []string {
		return answerStrings(query(t, addr, network, "details.", dns.TypeA, 0))
	}

	pc1, l1 := dupSockets(t, pc, l)
	h, stop := runHelper(t, Config{Names: testNames}, b.client(t), pc1, l1)
	if h.Ready() == nil {
		t.Fatal("Ready() = nil before the first table")
	}
	b.publish(t, oneService("10.0.0.1"))
	eventually(t, "ready after the first table", func() bool { return h.Ready() == nil })
	for _, network := range []string{"udp", "tcp"} {
		if got := lookup(network); !slices.Equal(got, []string{"details. a 10.0.0.1"}) {
			t.Errorf("first table over %s: %q", network, got)
		}
	}
	b.publish(t, oneService("10.0.0.2"))
	eventually(t, "the updated table", func() bool { return slices.Equal(lookup("udp"), []string{"details. a 10.0.0.2"}) })

	// A restarted helper on the same sockets answers from the retained table at once, also
	// the query that waited in the socket's queue while no helper ran.
	stop()
	b.publish(t, oneService("10.0.0.3")) // while no helper runs
	queued := make(chan []string, 1)
	go func() {
		m := new(dns.Msg).SetQuestion("details.", dns.TypeA)
		resp, _, err := (&dns.Client{Timeout: 10 * time.Second}).Exchange(m, addr)
		if err != nil {
			queued <- []string{err.Error()}
			return
		}
		queued <- answerStrings(resp)
	}()
	time.Sleep(50 * time.Millisecond) // let the query reach the queue first; either order must pass
	pc2, l2 := dupSockets(t, pc, l)
	h2, _ := runHelper(t, Config{Names: testNames}, b.client(t), pc2, l2)
	if got := <-queued; !slices.Equal(got, []string{"details. a 10.0.0.3"}) {
		t.Errorf("query queued while no helper ran: %q, want the table published meanwhile", got)
	}
	eventually(t, "the restarted helper's readiness", func() bool { return h2.Ready() == nil })
	for _, network := range []string{"udp", "tcp"} {
		if got := lookup(network); !slices.Equal(got, []string{"details. a 10.0.0.3"}) {
			t.Errorf("after the restart over %s: %q, want the table published meanwhile", network, got)
		}
	}
}

func TestHelperResubscribesWhenTheBusRestarts(t *testing.T) {
	broker := bus.New()
	path := filepath.Join(t.TempDir(), "bus.sock")
	b := startBus(t, broker, path)
	pc, l := listenPair(t)
	h, _ := runHelper(t, Config{Names: testNames}, b.client(t), pc, l)
	b.publish(t, oneService("10.0.0.1"))
	eventually(t, "ready", func() bool { return h.Ready() == nil })

	b.stop()
	os.Remove(path)
	b2 := startBus(t, broker, path)
	b2.publish(t, oneService("10.0.0.9"))
	addr := pc.LocalAddr().String()
	eventually(t, "the table published after the bus restart", func() bool {
		return slices.Equal(answerStrings(query(t, addr, "udp", "details.", dns.TypeA, 0)), []string{"details. a 10.0.0.9"})
	})
}

func TestConfigFrom(t *testing.T) {
	dir := t.TempDir()
	rc := filepath.Join(dir, "resolv.conf")
	os.WriteFile(rc, []byte("# comment\nnameserver 10.96.0.10\nnameserver 127.0.0.1:5353\nnameserver [::1]:5354\nnameserver fd00::53\n"+
		"search ns1.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"), 0o644)
	tests := []struct {
		name string
		in   *agentv1.DNSProxyConfig
		want Config
		err  bool
	}{
		{"istio defaults", &agentv1.DNSProxyConfig{ResolvConf: rc, PodNamespace: "ns1"}, Config{
			Names:     Names{Namespace: "ns1", Domain: "svc.cluster.local", Search: []string{"ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"}},
			Upstreams: []string{"10.96.0.10:53", "127.0.0.1:5353", "[::1]:5354", "[fd00::53]:53"},
		}, false},
		{"overrides", &agentv1.DNSProxyConfig{ResolvConf: rc, PodNamespace: "ns1", ProxyDomain: "ns1.svc.corp.example", SearchDomains: []string{"corp.example"},
			ForwardTimeout: durationpb.New(2 * time.Second), ForwardParallel: true, RespondBeforeSync: true}, Config{
			Names:          Names{Namespace: "ns1", Domain: "svc.corp.example", Search: []string{"corp.example"}},
			Upstreams:      []string{"10.96.0.10:53", "127.0.0.1:5353", "[::1]:5354", "[fd00::53]:53"},
			ForwardTimeout: 2 * time.Second, ForwardParallel: true, RespondBeforeSync: true,
		}, false},
		{"missing resolv.conf", &agentv1.DNSProxyConfig{ResolvConf: filepath.Join(dir, "nope")}, Config{}, true},
	}
	for _, tt := range tests {
		got, err := configFrom(tt.in)
		if (err != nil) != tt.err {
			t.Errorf("%s: configFrom() error = %v, want error %v", tt.name, err, tt.err)
			continue
		}
		if !slices.Equal(got.Upstreams, tt.want.Upstreams) || !slices.Equal(got.Names.Search, tt.want.Names.Search) ||
			got.Names.Namespace != tt.want.Names.Namespace || got.Names.Domain != tt.want.Names.Domain ||
			got.ForwardTimeout != tt.want.ForwardTimeout || got.ForwardParallel != tt.want.ForwardParallel ||
			got.RespondBeforeSync != tt.want.RespondBeforeSync {
			t.Errorf("%s: configFrom() = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestNewWithoutSockets(t *testing.T) {
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(rc, []byte("nameserver 127.0.0.1\n"), 0o644)
	cfg, _ := anypb.New(&agentv1.DNSProxyConfig{ResolvConf: rc})
	if _, err := New(&component.Env{Name: "dns-proxy", Config: cfg}); err == nil {
		t.Error("New() without inherited sockets = nil error")
	}
}
