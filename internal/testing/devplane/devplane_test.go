package devplane_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/agentd/agentd/internal/testing/devplane"
	"github.com/agentd/agentd/internal/testing/devplane/devplanetest"
	"github.com/agentd/agentd/internal/testing/samplewasm"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestProxylessClient dials the test service through devplane with grpc-go's own xDS client
// and makes real RPCs to a real backend, then moves the endpoint by rewriting the file.
func TestProxylessClient(t *testing.T) {
	b1, b2 := devplanetest.Backend(t), devplanetest.Backend(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "services.yaml")
	writeServices(t, file, b1)
	f, err := devplane.LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	addr, srv := devplanetest.Devplane(t, f.Services)
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan error, 1)
	go func() { watched <- srv.WatchFile(ctx, file) }()
	t.Cleanup(func() {
		cancel()
		if err := <-watched; err != nil {
			t.Error(err)
		}
	})

	cc := devplanetest.Dial(t, devplanetest.Bootstrap(t, addr), devplanetest.Target)
	devplanetest.WaitBackend(t, cc, b1)

	writeServices(t, file, b2)
	devplanetest.WaitBackend(t, cc, b2)

	// A file that does not parse keeps the last good services.
	if err := os.WriteFile(file, []byte("services: [{hostname: ''}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past the reload delay
	if got, err := devplanetest.Call(context.Background(), cc); err != nil || got != b2 {
		t.Fatalf("after a bad file: Call = %q, %v; want %q", got, err, b2)
	}
}

func writeServices(t *testing.T, file, backend string) {
	t.Helper()
	host, port, err := net.SplitHostPort(backend)
	if err != nil {
		t.Fatal(err)
	}
	yaml := `services:
- hostname: reviews.default.svc.cluster.local
  namespace: default
  addresses: [10.96.0.12]
  ports: [{name: grpc, port: 9080, protocol: GRPC}]
  endpoints: [{address: ` + host + `, port: ` + port + `}]
`
	// Write beside and rename, as editors and kubelet do.
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

// adsClient opens a raw ADS connection to addr.
func adsClient(t *testing.T, addr string) discoveryv3.AggregatedDiscoveryServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return discoveryv3.NewAggregatedDiscoveryServiceClient(cc)
}

func node(id, generator string) *corev3.Node {
	meta, _ := structpb.NewStruct(map[string]any{"GENERATOR": generator})
	return &corev3.Node{Id: id, Metadata: meta}
}

func wantNameTable() *ndsv1.NameTable {
	return &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
		"reviews.default.svc.cluster.local": {
			Ips: []string{"10.96.0.12"}, Registry: "Kubernetes", Shortname: "reviews", Namespace: "default",
		},
	}}
}

// TestSotW asks for NDS and Envoy's clusters over SotW, sends a NACK and a health report, and
// finds both in the debug endpoint.
func TestSotW(t *testing.T) {
	addr, srv := devplanetest.Devplane(t, devplanetest.Services(t, "127.0.0.1:50051"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := adsClient(t, addr).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(r *discoveryv3.DiscoveryRequest) {
		t.Helper()
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	send(&discoveryv3.DiscoveryRequest{Node: node("sidecar~10.0.0.1~a.default~default.svc.cluster.local", "envoy"), TypeUrl: agentv1.TypeNameTable})
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.TypeUrl != agentv1.TypeNameTable || len(resp.Resources) != 1 {
		t.Fatalf("NDS response: type %s with %d resources", resp.TypeUrl, len(resp.Resources))
	}
	var nt ndsv1.NameTable
	if err := resp.Resources[0].UnmarshalTo(&nt); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(wantNameTable(), &nt, protocmp.Transform()); d != "" {
		t.Errorf("name table (-want +got):\n%s", d)
	}
	send(&discoveryv3.DiscoveryRequest{TypeUrl: agentv1.TypeNameTable, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce})

	send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType})
	resp, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.TypeUrl != resourcev3.ClusterType || len(resp.Resources) != 2 { // the service and PassthroughCluster
		t.Fatalf("CDS response: type %s with %d resources", resp.TypeUrl, len(resp.Resources))
	}
	send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: "", ResponseNonce: resp.Nonce,
		ErrorDetail: &status.Status{Code: 13, Message: "bad cluster"}})
	send(&discoveryv3.DiscoveryRequest{TypeUrl: devplane.HealthInfoType, ErrorDetail: &status.Status{Code: 13, Message: "probe failed"}})

	debug := httptest.NewServer(srv.DebugHandler())
	defer debug.Close()
	waitFor(t, func() bool {
		var health map[string]devplane.HealthReport
		getJSON(t, debug.URL+"/debug/health", &health)
		r, ok := health["sidecar~10.0.0.1~a.default~default.svc.cluster.local"]
		return ok && !r.Healthy && r.Message == "probe failed"
	})
	var nacks []devplane.NACK
	getJSON(t, debug.URL+"/debug/nacks", &nacks)
	if len(nacks) != 1 || nacks[0].TypeURL != resourcev3.ClusterType || nacks[0].Message != "bad cluster" {
		t.Errorf("NACKs = %+v, want one for clusters with message %q", nacks, "bad cluster")
	}
}

// TestDelta subscribes to NDS and the proxyless listener over delta, and gets pushes when the
// services change; a health report sent without a node is recorded under the stream's node.
func TestDelta(t *testing.T) {
	addr, srv := devplanetest.Devplane(t, devplanetest.Services(t, "127.0.0.1:50051"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := adsClient(t, addr).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(r *discoveryv3.DeltaDiscoveryRequest) {
		t.Helper()
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(typeURL string) *discoveryv3.DeltaDiscoveryResponse {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.TypeUrl != typeURL {
			t.Fatalf("response type %s, want %s", resp.TypeUrl, typeURL)
		}
		send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.Nonce})
		return resp
	}
	send(&discoveryv3.DeltaDiscoveryRequest{Node: node("proxyless-1", "grpc"), TypeUrl: agentv1.TypeNameTable})
	if resp := recv(agentv1.TypeNameTable); len(resp.Resources) != 1 {
		t.Fatalf("NDS: %d resources, want 1", len(resp.Resources))
	}
	send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: []string{"outbound|9080||reviews.default.svc.cluster.local"}})
	if resp := recv(resourcev3.EndpointType); len(resp.Resources) != 1 {
		t.Fatalf("EDS: %d resources, want 1", len(resp.Resources))
	}

	moved := devplanetest.Services(t, "127.0.0.1:50052")
	if err := srv.Update(ctx, moved); err != nil {
		t.Fatal(err)
	}
	// The endpoints are pushed; the name table did not change, so it is not.
	resp := recv(resourcev3.EndpointType)
	if len(resp.Resources) != 1 || resp.Resources[0].Name != "outbound|9080||reviews.default.svc.cluster.local" {
		t.Fatalf("EDS push: %v", resp.Resources)
	}

	send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: devplane.HealthInfoType})
	waitFor(t, func() bool {
		r, ok := srv.Health()["proxyless-1"]
		return ok && r.Healthy
	})
}

func TestRunServesFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeServices(t, file, "127.0.0.1:50051")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- devplane.Run(ctx, devplane.Config{XDSAddress: "127.0.0.1:0", ServicesFile: file, DebugAddress: "127.0.0.1:0", Log: hclog.NewNullLogger()})
	}()
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
	if err := devplane.Run(context.Background(), devplane.Config{ServicesFile: filepath.Join(t.TempDir(), "missing.yaml")}); err == nil {
		t.Error("Run with a missing services file = nil, want an error")
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSampleModule: the quickstart's services file pins the sample Wasm module devplane
// serves on its default debug address, by a sha256 that is the served module's.
func TestSampleModule(t *testing.T) {
	f, err := devplane.LoadFile("../../../deploy/examples/services.yaml")
	if err != nil {
		t.Fatal(err)
	}
	debug := httptest.NewServer(devplane.New(t.Context(), hclog.NewNullLogger()).DebugHandler())
	defer debug.Close()
	resp, err := http.Get(debug.URL + devplane.SampleModulePath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	module, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(module, samplewasm.Module()) {
		t.Fatalf("GET %s: %s, %d bytes, %v; want the sample module", devplane.SampleModulePath, resp.Status, len(module), err)
	}
	sum := sha256.Sum256(module)
	want := devplane.WasmPlugin{Name: "sample", Namespace: "default", URL: "http://127.0.0.1:15014" + devplane.SampleModulePath,
		SHA256: hex.EncodeToString(sum[:]), FailStrategy: "FAIL_OPEN"}
	if len(f.WasmPlugins) != 1 || f.WasmPlugins[0] != want {
		t.Errorf("the quickstart's WasmPlugins = %+v, want [%+v]", f.WasmPlugins, want)
	}
}
