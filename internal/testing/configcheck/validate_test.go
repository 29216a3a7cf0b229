package configcheck

import (
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestValidateEntersAnyPayloads(t *testing.T) {
	bad := &httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{
				MaxConcurrentStreams: wrapperspb.UInt32(0), // must be 1..2147483647
			}},
		}},
	}
	a, err := anypb.New(bad)
	if err != nil {
		t.Fatal(err)
	}
	c := &clusterv3.Cluster{
		Name:                          "x",
		ClusterDiscoveryType:          &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:                durationpb.New(1e9),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": a},
	}
	b := &bootstrapv3.Bootstrap{StaticResources: &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{c}}}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("ValidateAll = %v; the point of this test is that it does not see the payload", err)
	}
	err = Validate(b)
	if err == nil || !strings.Contains(err.Error(), "MaxConcurrentStreams") {
		t.Fatalf("Validate = %v, want the invalid MaxConcurrentStreams inside the Any", err)
	}
	js, err := protojson.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseBootstrap(js); err == nil {
		t.Fatal("ParseBootstrap accepted an invalid Any payload")
	}
}

// TestParseBootstrapStrict: what Envoy would not read (an unknown field, an Any of a type
// nobody registered) is an error, not something dropped.
func TestParseBootstrapStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field": `{"nodes": {}}`,
		"unknown type": `{"bootstrap_extensions": [{"name": "x", "typed_config":
			{"@type": "type.googleapis.com/example.NotAType"}}]}`,
	} {
		if _, err := ParseBootstrap([]byte(doc)); err == nil {
			t.Errorf("%s: ParseBootstrap accepted %s", name, doc)
		}
	}
	if _, err := ParseBootstrap([]byte(`{"node": {"id": "x"}}`)); err != nil {
		t.Errorf("ParseBootstrap(minimal) = %v", err)
	}
}

// TestValidateKnownSkipsUnknownTypes: Istio's own filters, which go-control-plane does not
// have, pass ValidateKnown unchecked but fail Validate.
func TestValidateKnownSkipsUnknownTypes(t *testing.T) {
	c := &clusterv3.Cluster{
		Name:                          "x",
		ConnectTimeout:                durationpb.New(1e9),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{"istio": {TypeUrl: "type.googleapis.com/istio.Unknown"}},
	}
	if err := ValidateKnown(c); err != nil {
		t.Errorf("ValidateKnown = %v", err)
	}
	if err := Validate(c); err == nil {
		t.Error("Validate accepted an Any of an unknown type")
	}
}
