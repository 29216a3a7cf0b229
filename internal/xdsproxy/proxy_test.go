package xdsproxy

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/agentd/agentd/internal/testing/devplane/devplanetest"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// TestProxylessClients runs two grpc-go xDS clients at once through the proxy to devplane:
// both make real RPCs to a real backend and follow when the endpoint moves.
func TestProxylessClients(t *testing.T) {
	b1, b2 := devplanetest.Backend(t), devplanetest.Backend(t)
	addr, dev := devplanetest.Devplane(t, devplanetest.Services(t, b1))
	tp := startProxy(t, Config{Upstream: Upstream{Address: addr, ClusterID: "Kubernetes"}, NameTable: true})

	clients := []*grpc.ClientConn{
		devplanetest.Dial(t, devplanetest.Bootstrap(t, tp.uri()), devplanetest.Target),
		devplanetest.Dial(t, devplanetest.Bootstrap(t, tp.uri()), devplanetest.Target),
	}
	for _, c := range clients {
		devplanetest.WaitBackend(t, c, b1)
	}
	if err := dev.Update(context.Background(), devplanetest.Services(t, b2)); err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		devplanetest.WaitBackend(t, c, b2)
	}
	if n := tp.counter(t, "istio_agent_xds_proxy_responses"); n < 8 { // LDS, RDS, CDS, EDS, twice
		t.Errorf("istio_agent_xds_proxy_responses = %v, want at least 8", n)
	}
	// The name table went to the bus, not to the clients (which would have failed on it).
	var nt ndsv1.NameTable
	tp.bus.waitRetained(t, agentv1.TopicNameTable, &nt)
	if _, ok := nt.Table["reviews.default.svc.cluster.local"]; !ok {
		t.Errorf("published name table %v lacks the service", nt.Table)
	}
}

// xdsStream is a raw ADS client stream of either flavour.
type xdsStream interface {
	subscribe(t testing.TB, typeURL string, node *corev3.Node)
	recv(t testing.TB) response
	// ack acknowledges r, or rejects it when message is not empty.
	ack(t testing.TB, r response, message string)
	close()
}

type response struct{ typeURL, version, nonce string }

type sotwStream struct {
	s      discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	cancel context.CancelFunc
}

func (s *sotwStream) subscribe(t testing.TB, typeURL string, node *corev3.Node) {
	t.Helper()
	if err := s.s.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL}); err != nil {
		t.Fatal(err)
	}
}

func (s *sotwStream) recv(t testing.TB) response {
	t.Helper()
	r, err := s.s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return response{r.TypeUrl, r.VersionInfo, r.Nonce}
}

func (s *sotwStream) ack(t testing.TB, r response, message string) {
	t.Helper()
	req := &discoveryv3.DiscoveryRequest{TypeUrl: r.typeURL, VersionInfo: r.version, ResponseNonce: r.nonce}
	if message != "" {
		req.VersionInfo = ""
		req.ErrorDetail = &status.Status{Code: 13, Message: message}
	}
	if err := s.s.Send(req); err != nil {
		t.Fatal(err)
	}
}

func (s *sotwStream) close() { s.cancel() }

type deltaStream struct {
	s      discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	cancel context.CancelFunc
}

func (s *deltaStream) subscribe(t testing.TB, typeURL string, node *corev3.Node) {
	t.Helper()
	if err := s.s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: typeURL}); err != nil {
		t.Fatal(err)
	}
}

func (s *deltaStream) recv(t testing.TB) response {
	t.Helper()
	r, err := s.s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return response{r.TypeUrl, r.SystemVersionInfo, r.Nonce}
}

func (s *deltaStream) ack(t testing.TB, r response, message string) {
	t.Helper()
	req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: r.typeURL, ResponseNonce: r.nonce}
	if message != "" {
		req.ErrorDetail = &status.Status{Code: 13, Message: message}
	}
	if err := s.s.Send(req); err != nil {
		t.Fatal(err)
	}
}

func (s *deltaStream) close() { s.cancel() }

// flavours opens a raw stream of each flavour.
var flavours = []struct {
	name string
	open func(t testing.TB, c discoveryv3.AggregatedDiscoveryServiceClient) xdsStream
}{
	{"sotw", func(t testing.TB, c discoveryv3.AggregatedDiscoveryServiceClient) xdsStream {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := c.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cancel)
		return &sotwStream{s, cancel}
	}},
	{"delta", func(t testing.TB, c discoveryv3.AggregatedDiscoveryServiceClient) xdsStream {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := c.DeltaAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cancel)
		return &deltaStream{s, cancel}
	}},
}

// TestNameTableConsumed: after the client's LDS request the proxy asks for NDS itself,
// publishes the table on the bus and never passes it to the client.
func TestNameTableConsumed(t *testing.T) {
	for _, fl := range flavours {
		t.Run(fl.name, func(t *testing.T) {
			addr, dev := devplanetest.Devplane(t, devplanetest.Services(t, "127.0.0.1:50051"))
			tp := startProxy(t, Config{Upstream: Upstream{Address: addr}, NameTable: true})
			s := fl.open(t, adsClient(t, tp.uri()))
			s.subscribe(t, resourcev3.ListenerType, testNode("sidecar~10.0.0.1~a.default~default.svc.cluster.local", "envoy"))

			var nt ndsv1.NameTable
			tp.bus.waitRetained(t, agentv1.TopicNameTable, &nt)
			want := &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{"reviews.default.svc.cluster.local": {
				Ips: []string{"10.96.0.12"}, Registry: "Kubernetes", Shortname: "reviews", Namespace: "default",
			}}}
			if d := cmp.Diff(want, &nt, protocmp.Transform()); d != "" {
				t.Errorf("published name table (-want +got):\n%s", d)
			}
			// Responses reach the client in order: anything sent before the CDS answer
			// would arrive first.
			s.subscribe(t, resourcev3.ClusterType, nil)
			for {
				r := s.recv(t)
				if r.typeURL == agentv1.TypeNameTable {
					t.Fatal("the client received the name table")
				}
				s.ack(t, r, "")
				if r.typeURL == resourcev3.ClusterType {
					break
				}
			}
			if n := dev.NACKs(); len(n) != 0 {
				t.Errorf("devplane received NACKs %v, want the name table ACKed", n)
			}
		})
	}
}

// TestNACKReachesUpstream: a client's NACK arrives at the control plane unchanged.
func TestNACKReachesUpstream(t *testing.T) {
	for _, fl := range flavours {
		t.Run(fl.name, func(t *testing.T) {
			addr, dev := devplanetest.Devplane(t, devplanetest.Services(t, "127.0.0.1:50051"))
			tp := startProxy(t, Config{Upstream: Upstream{Address: addr}})
			s := fl.open(t, adsClient(t, tp.uri()))
			s.subscribe(t, resourcev3.ClusterType, testNode("node-nack", "envoy"))
			r := s.recv(t)
			s.ack(t, r, "cluster rejected")
			waitFor(t, "the NACK at devplane", func() bool { return len(dev.NACKs()) > 0 })
			got := dev.NACKs()[0]
			if got.Node != "node-nack" || got.TypeURL != resourcev3.ClusterType || got.Nonce != r.nonce || got.Message != "cluster rejected" {
				t.Errorf("NACK = %+v, want node-nack, clusters, nonce %q, message %q", got, r.nonce, "cluster rejected")
			}
		})
	}
}

// TestHealthReports: a report is held until the stream's first LDS request, sent then, sent
// again when it changes, and re-sent on every new stream.
func TestHealthReports(t *testing.T) {
	for _, fl := range flavours {
		t.Run(fl.name, func(t *testing.T) {
			addr, dev := devplanetest.Devplane(t, devplanetest.Services(t, "127.0.0.1:50051"))
			tp := startProxy(t, Config{Upstream: Upstream{Address: addr}})
			tp.SetHealth(&agentv1.WorkloadHealth{Healthy: false, Message: "probe failed"})
			client := adsClient(t, tp.uri())
			node := testNode("node-health", "envoy")

			s := fl.open(t, client)
			s.subscribe(t, resourcev3.ClusterType, node)
			s.ack(t, s.recv(t), "")
			s.subscribe(t, resourcev3.EndpointType, nil)
			s.recv(t) // the proxy queues in order: a report would have reached devplane by now
			if h := dev.Health(); len(h) != 0 {
				t.Fatalf("health before the first LDS request: %v, want none", h)
			}
			s.subscribe(t, resourcev3.ListenerType, nil)
			waitFor(t, "the unhealthy report", func() bool {
				r, ok := dev.Health()["node-health"]
				return ok && !r.Healthy && r.Message == "probe failed"
			})
			tp.SetHealth(&agentv1.WorkloadHealth{Healthy: true})
			waitFor(t, "the healthy report", func() bool { return dev.Health()["node-health"].Healthy })
			first := dev.Health()["node-health"].Time
			s.close()

			s = fl.open(t, client)
			s.subscribe(t, resourcev3.ListenerType, node)
			waitFor(t, "the report re-sent on the new stream", func() bool {
				r := dev.Health()["node-health"]
				return r.Healthy && r.Time.After(first)
			})
		})
	}
}

// TestUpstreamDown: while the control plane is away, the client's streams fail and are
// counted; when it comes back on the same address, the client's retry gets through.
func TestUpstreamDown(t *testing.T) {
	backend := devplanetest.Backend(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	tp := startProxy(t, Config{Upstream: Upstream{Address: addr}})
	cc := devplanetest.Dial(t, devplanetest.Bootstrap(t, tp.uri()), devplanetest.Target)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := devplanetest.Call(ctx, cc); err == nil {
		t.Fatal("a call succeeded with no control plane")
	}
	waitFor(t, "a counted connection failure", func() bool { return tp.counter(t, "istio_agent_istiod_connection_failures") > 0 })

	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	devplanetest.ServeDevplane(t, l, devplanetest.Services(t, backend))
	devplanetest.WaitBackend(t, cc, backend)
}

// TestUpstreamHeaders: each upstream stream carries ClusterID, the XDS_HEADER_ extras and the
// token, read fresh for every stream.
func TestUpstreamHeaders(t *testing.T) {
	up := startFakeUpstream(t)
	token := filepath.Join(tempDir(t), "istio-token")
	if err := os.WriteFile(token, []byte("token-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tp := startProxy(t, Config{Upstream: Upstream{
		Address: up.addr, ClusterID: "cluster-a", Headers: map[string]string{"x-team": "mesh"}, TokenPath: token,
	}})
	client := adsClient(t, tp.uri())
	for _, want := range []string{"token-1", "token-2"} {
		s := flavours[0].open(t, client)
		s.subscribe(t, resourcev3.ListenerType, testNode("n", "envoy"))
		md := (<-up.opened).md
		for k, v := range map[string]string{"clusterid": "cluster-a", "x-team": "mesh", "authorization": "Bearer " + want} {
			if got := md.Get(k); len(got) != 1 || got[0] != v {
				t.Errorf("upstream header %s = %v, want %q", k, got, v)
			}
		}
		s.close()
		if err := os.WriteFile(token, []byte("token-2"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
