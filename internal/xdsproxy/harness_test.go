package xdsproxy

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/agentd/agentd/internal/bus"
	"github.com/agentd/agentd/internal/component"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tempDir is a short temporary directory: Unix socket paths are limited to 108 bytes.
func tempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "xdsp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// serveGRPC serves g on l until the test ends.
func serveGRPC(t testing.TB, g *grpc.Server, l net.Listener) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(l) // ends with Stop
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
}

// testBus is agentd's bus served in-process over gRPC, as helpers reach it.
type testBus struct {
	broker *bus.Broker
	client *component.Bus
}

func newTestBus(t testing.TB) *testBus {
	t.Helper()
	sock := filepath.Join(tempDir(t), "bus")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	b := bus.New()
	g := grpc.NewServer()
	agentv1.RegisterBusServer(g, b.Server())
	serveGRPC(t, g, l)
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &testBus{broker: b, client: component.NewBus(agentv1.NewBusClient(cc))}
}

// waitRetained waits for a message on topic and decodes it into m.
func (b *testBus) waitRetained(t testing.TB, topic string, m proto.Message) {
	t.Helper()
	waitFor(t, "a message on "+topic, func() bool { return b.broker.Retained(topic) != nil })
	if err := b.broker.Retained(topic).GetPayload().UnmarshalTo(m); err != nil {
		t.Fatal(err)
	}
}

// testProxy is a proxy serving on a temporary Unix socket.
type testProxy struct {
	*Proxy
	sock    string
	bus     *testBus
	metrics *prometheus.Registry
}

func startProxy(t testing.TB, cfg Config) *testProxy {
	t.Helper()
	tp := &testProxy{sock: filepath.Join(tempDir(t), "XDS"), bus: newTestBus(t), metrics: prometheus.NewRegistry()}
	log := hclog.New(&hclog.LoggerOptions{Name: "xds-proxy", Level: hclog.Debug, Output: testWriter{t}})
	p, err := NewProxy(cfg, log, tp.bus.client, tp.metrics)
	if err != nil {
		t.Fatal(err)
	}
	tp.Proxy = p
	l, err := net.Listen("unix", tp.sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v", err)
		}
	})
	return tp
}

func (tp *testProxy) uri() string { return "unix://" + tp.sock }

func (tp *testProxy) counter(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := tp.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i, lp := range m.GetLabel() {
				if i*2+1 >= len(labels) || lp.GetName() != labels[i*2] || lp.GetValue() != labels[i*2+1] {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// testWriter sends the proxy's log to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// adsClient is a raw ADS client of the proxy.
func adsClient(t testing.TB, target string) discoveryv3.AggregatedDiscoveryServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return discoveryv3.NewAggregatedDiscoveryServiceClient(cc)
}

func testNode(id, generator string) *corev3.Node {
	meta, _ := structpb.NewStruct(map[string]any{"GENERATOR": generator})
	return &corev3.Node{Id: id, Metadata: meta}
}

var errKilled = status.Error(codes.Internal, "stream killed by the test")

// fakeUpstream is a control plane that sends scripted bytes and records what it receives,
// for the tests that need exact bytes or broken messages.
type fakeUpstream struct {
	addr string

	mu       sync.Mutex
	streams  int
	headers  []metadata.MD
	requests []*frame          // every request received, in order
	send     chan []byte       // responses to send on the current stream
	kill     chan struct{}     // ends the current stream with an error
	recv     chan *frame       // every request, as it arrives
	opened   chan openedStream // each new stream
	ended    chan struct{}     // each stream that ended
}

// openedStream is what the upstream saw of a new stream.
type openedStream struct {
	md          metadata.MD
	clientCerts int // certificates the client presented over TLS
}

func startFakeUpstream(t testing.TB, opts ...grpc.ServerOption) *fakeUpstream {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &fakeUpstream{addr: l.Addr().String(), send: make(chan []byte, 16), kill: make(chan struct{}, 1),
		recv: make(chan *frame, 1000), opened: make(chan openedStream, 16), ended: make(chan struct{}, 16)}
	g := grpc.NewServer(append(opts, grpc.ForceServerCodecV2(codec{}), grpc.UnknownServiceHandler(u.handle))...)
	serveGRPC(t, g, l)
	return u
}

func (u *fakeUpstream) handle(_ any, ss grpc.ServerStream) error {
	defer func() { u.ended <- struct{}{} }()
	md, _ := metadata.FromIncomingContext(ss.Context())
	u.mu.Lock()
	u.streams++
	u.headers = append(u.headers, md)
	u.mu.Unlock()
	o := openedStream{md: md}
	if p, ok := peer.FromContext(ss.Context()); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			o.clientCerts = len(info.State.PeerCertificates)
		}
	}
	u.opened <- o
	method, _ := grpc.MethodFromServerStream(ss)
	field := sotw.requestTypeURL()
	if strings.HasSuffix(method, "DeltaAggregatedResources") {
		field = delta.requestTypeURL()
	}
	errc := make(chan error, 1)
	go func() {
		for {
			f := &frame{typeURLField: field}
			if err := ss.RecvMsg(f); err != nil {
				errc <- err
				return
			}
			u.mu.Lock()
			u.requests = append(u.requests, f)
			u.mu.Unlock()
			u.recv <- f
		}
	}()
	for {
		select {
		case b := <-u.send:
			if err := ss.SendMsg(&frame{data: b}); err != nil {
				return err
			}
		case <-u.kill:
			return errKilled
		case err := <-errc:
			return err
		case <-ss.Context().Done():
			return nil
		}
	}
}

// nextRequest returns the next request of typeURL the upstream receives, skipping others.
func (u *fakeUpstream) nextRequest(t testing.TB, typeURL string) *frame {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case f := <-u.recv:
			if f.typeURL == typeURL {
				return f
			}
		case <-timeout:
			t.Fatalf("upstream never received a %s request", typeURL)
		}
	}
}
