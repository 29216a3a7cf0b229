package xdsproxy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/agentd/agentd/internal/testing/ecdsclient"
	"github.com/agentd/agentd/internal/wasm"
	"github.com/agentd/agentd/internal/wasm/wasmtest"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// wasmPlugin is an ECDS resource as istiod sends a WasmPlugin: an HTTP Wasm filter with
// remote code (or local code when url has no scheme).
func wasmPlugin(t testing.TB, name, url, sha string, policy wasmv3.FailurePolicy) *anypb.Any {
	t.Helper()
	code := &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{
		HttpUri: &corev3.HttpUri{Uri: url, Timeout: durationpb.New(2 * time.Second)}, Sha256: sha,
	}}}
	if !strings.Contains(url, "://") {
		code = &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{Local: &corev3.DataSource{
			Specifier: &corev3.DataSource_Filename{Filename: url},
		}}}
	}
	w := &httpwasm.Wasm{Config: &wasmv3.PluginConfig{Name: name, FailurePolicy: policy, Vm: &wasmv3.PluginConfig_VmConfig{
		VmConfig: &wasmv3.VmConfig{Runtime: "envoy.wasm.runtime.v8", Code: code},
	}}}
	tc, err := anypb.New(w)
	if err != nil {
		t.Fatal(err)
	}
	a, err := anypb.New(&corev3.TypedExtensionConfig{Name: name, TypedConfig: tc})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// loaded says what an ECDS resource makes Envoy load (ecdsclient.Loads).
func loaded(t testing.TB, a *anypb.Any) string {
	t.Helper()
	_, what, err := ecdsclient.Loads(a)
	if err != nil {
		t.Fatal(err)
	}
	return what
}

// ecdsClient is a raw ADS client stream of either flavour that reads resources.
type ecdsClient struct {
	send func(typeURL, version, nonce string) error
	recv func() (typeURL string, res []*anypb.Any, err error)
}

func openECDSClient(t *testing.T, fl string, uri string) *ecdsClient {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	c := adsClient(t, uri)
	node := testNode("node-wasm", "envoy")
	if fl == "sotw" {
		s, err := c.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return &ecdsClient{
			send: func(typeURL, version, nonce string) error {
				return s.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, VersionInfo: version, ResponseNonce: nonce})
			},
			recv: func() (string, []*anypb.Any, error) {
				r, err := s.Recv()
				return r.GetTypeUrl(), r.GetResources(), err
			},
		}
	}
	s, err := c.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &ecdsClient{
		send: func(typeURL, _, nonce string) error {
			return s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: typeURL, ResponseNonce: nonce})
		},
		recv: func() (string, []*anypb.Any, error) {
			r, err := s.Recv()
			var res []*anypb.Any
			for _, x := range r.GetResources() {
				res = append(res, x.GetResource())
			}
			return r.GetTypeUrl(), res, err
		},
	}
}

// ecdsResponse encodes a response of the flavour with resources.
func ecdsResponse(t testing.TB, fl, typeURL, version, nonce string, res ...*anypb.Any) []byte {
	t.Helper()
	var m proto.Message = &discoveryv3.DiscoveryResponse{TypeUrl: typeURL, VersionInfo: version, Nonce: nonce, Resources: res}
	if fl == "delta" {
		d := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, SystemVersionInfo: version, Nonce: nonce}
		for i, r := range res {
			d.Resources = append(d.Resources, &discoveryv3.Resource{Name: string(rune('a' + i)), Version: version, Resource: r})
		}
		m = d
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestECDSConversion: every case of a WasmPlugin reaches the client converted as Istio's
// agent converts it, from a real registry and HTTP server; a response with a resource that
// cannot be converted is NACKed upstream with the last ACKed version and not forwarded; a
// slow module does not hold back the other types.
func TestECDSConversion(t *testing.T) {
	module := wasmtest.Module("ecds")
	srv := wasmtest.Start(t, module)
	for _, fl := range []string{"sotw", "delta"} {
		t.Run(fl, func(t *testing.T) {
			dir := filepath.Join(tempDir(t), "var/lib/istio/data")
			cache, err := NewWasmCache(&agentv1.WasmConfig{CacheDir: dir}, hclog.NewNullLogger(), nil)
			if err != nil {
				t.Fatal(err)
			}
			up := startFakeUpstream(t)
			tp := startProxy(t, Config{Upstream: Upstream{Address: up.addr}, Wasm: wasm.NewConverter(cache)})
			c := openECDSClient(t, fl, tp.uri())
			if err := c.send(ExtensionConfigType, "", ""); err != nil {
				t.Fatal(err)
			}
			up.nextRequest(t, ExtensionConfigType)

			cases := []struct{ name, url, sha, want string }{
				{"oci-artifact", "oci://" + srv.Images[wasmtest.Artifact], srv.Digests[wasmtest.Artifact], "file"},
				{"oci-compat", "oci://" + srv.Images[wasmtest.Compat], "", "file"},
				{"http", srv.HTTP + "/plugin.wasm", wasmtest.SHA256(module), "file"},
				{"wrong-sha256", srv.HTTP + "/plugin.wasm", strings.Repeat("0", 64), "deny"},
				{"unreachable-open", "oci://127.0.0.1:1/wasm/none:v1", "", "allow"},
				{"unreachable-close", "oci://127.0.0.1:1/wasm/none:v1", "", "deny"},
				{"local", "/usr/local/lib/plugin.wasm", "", "file:/usr/local/lib/plugin.wasm"},
			}
			var res []*anypb.Any
			for _, tc := range cases {
				policy := wasmv3.FailurePolicy_FAIL_CLOSED
				if strings.HasSuffix(tc.name, "-open") {
					policy = wasmv3.FailurePolicy_FAIL_OPEN
				}
				res = append(res, wasmPlugin(t, tc.name, tc.url, tc.sha, policy))
			}
			up.send <- ecdsResponse(t, fl, ExtensionConfigType, "1", "n1", res...)
			typ, got, err := c.recv()
			if err != nil || typ != ExtensionConfigType || len(got) != len(cases) {
				t.Fatalf("client received %s with %d resources, %v; want ECDS with %d", typ, len(got), err, len(cases))
			}
			for i, tc := range cases {
				l := loaded(t, got[i])
				if tc.want == "file" {
					p, ok := strings.CutPrefix(l, "file:")
					b, err := os.ReadFile(p)
					if !ok || !strings.HasPrefix(p, dir) || err != nil || string(b) != string(module) {
						t.Errorf("%s: client loads %s (%v), want the cached module under %s", tc.name, l, err, dir)
					}
				} else if l != tc.want {
					t.Errorf("%s: client loads %s, want %s", tc.name, l, tc.want)
				}
			}
			if err := c.send(ExtensionConfigType, "1", "n1"); err != nil { // the client's ACK
				t.Fatal(err)
			}
			up.nextRequest(t, ExtensionConfigType)

			// A module slower than the next push: LDS goes first, the plugin fails open after
			// its 2 s pull timeout.
			up.send <- ecdsResponse(t, fl, ExtensionConfigType, "2", "n2", wasmPlugin(t, "slow", srv.HTTP+"/slow", "", wasmv3.FailurePolicy_FAIL_OPEN))
			up.send <- ecdsResponse(t, fl, resourcev3.ListenerType, "1", "l1")
			for _, want := range []string{resourcev3.ListenerType, ExtensionConfigType} {
				typ, got, err := c.recv()
				if err != nil || typ != want {
					t.Fatalf("client received %s, %v; want %s", typ, err, want)
				}
				if typ == ExtensionConfigType && loaded(t, got[0]) != "allow" {
					t.Errorf("slow module: client loads %s, want allow", loaded(t, got[0]))
				}
			}

			// A resource that does not decode: NACKed upstream with the last ACKed version.
			up.send <- ecdsResponse(t, fl, ExtensionConfigType, "3", "n3", &anypb.Any{TypeUrl: ExtensionConfigType, Value: []byte{0xff}})
			nackFrame := up.nextRequest(t, ExtensionConfigType)
			version, nonce, detail := decodeRequest(t, fl, nackFrame.data)
			wantVersion := "1"
			if fl == "delta" {
				wantVersion = ""
			}
			if nonce != "n3" || detail == "" || version != wantVersion {
				t.Errorf("upstream got version %q nonce %q error %q; want a NACK of n3 with version %q", version, nonce, detail, wantVersion)
			}
			if n := tp.counter(t, "istio_agent_xds_proxy_responses"); n != 4 {
				t.Errorf("responses counted = %v, want 4", n)
			}
		})
	}
}

func decodeRequest(t testing.TB, fl string, b []byte) (version, nonce, detail string) {
	t.Helper()
	if fl == "sotw" {
		r := &discoveryv3.DiscoveryRequest{}
		if err := proto.Unmarshal(b, r); err != nil {
			t.Fatal(err)
		}
		return r.VersionInfo, r.ResponseNonce, r.GetErrorDetail().GetMessage()
	}
	r := &discoveryv3.DeltaDiscoveryRequest{}
	if err := proto.Unmarshal(b, r); err != nil {
		t.Fatal(err)
	}
	return "", r.ResponseNonce, r.GetErrorDetail().GetMessage()
}

// TestNewWasmCacheBlockedCIDRs: a range that does not parse is skipped, as Istio skips it,
// and the others still block.
func TestNewWasmCacheBlockedCIDRs(t *testing.T) {
	srv := wasmtest.Start(t, wasmtest.Module("cidr"))
	cache, err := NewWasmCache(&agentv1.WasmConfig{
		CacheDir:     tempDir(t),
		BlockedCidrs: []string{"bogus", " 127.0.0.0/8 ", "::1/128"},
	}, hclog.NewNullLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := cache.Get(t.Context(), srv.HTTP+"/plugin.wasm", wasm.GetOptions{}); err == nil || !strings.Contains(err.Error(), "blocked") {
		t.Errorf("Get from a blocked range = %q, %v; want blocked", p, err)
	}
}
