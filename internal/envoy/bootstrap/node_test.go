package bootstrap

import (
	"slices"
	"testing"
)

// TestGRPCNode: the gRPC bootstrap's node has Istio's typed metadata keys only (the untyped
// ISTIO_META_* and ISTIO_METAJSON_* keys and false booleans left out), the Envoy node all.
func TestGRPCNode(t *testing.T) {
	c := goldenCases[0].config(t)
	c.Env = append(slices.Clone(c.Env), "ISTIO_META_CUSTOM_FLAG=on", "ISTIO_META_DNS_CAPTURE=false", "ISTIO_META_DNS_AUTO_ALLOCATE=true")
	envoyNode, err := c.Node()
	if err != nil {
		t.Fatal(err)
	}
	grpcNode, err := c.GRPCNode()
	if err != nil {
		t.Fatal(err)
	}
	em, gm := envoyNode.GetMetadata().GetFields(), grpcNode.GetMetadata().GetFields()
	for key, want := range map[string][2]bool{ // in Envoy's node, in gRPC's
		"CUSTOM_FLAG": {true, false}, "app": {true, false}, "DNS_CAPTURE": {true, false},
		"DNS_AUTO_ALLOCATE": {true, true}, "CLUSTER_ID": {true, true}, "LABELS": {true, true}, "ISTIO_VERSION": {true, true},
	} {
		if _, ok := em[key]; ok != want[0] {
			t.Errorf("Envoy's node has %s: %v, want %v", key, ok, want[0])
		}
		if _, ok := gm[key]; ok != want[1] {
			t.Errorf("gRPC's node has %s: %v, want %v", key, ok, want[1])
		}
	}
	if em["DNS_CAPTURE"].GetStringValue() != "false" {
		t.Errorf("Envoy's DNS_CAPTURE = %v, want the untyped \"false\" as given", em["DNS_CAPTURE"])
	}
}
