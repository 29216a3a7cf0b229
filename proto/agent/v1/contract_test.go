package agentv1_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	meshv1 "istio.io/api/mesh/v1alpha1"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// TestTypeURLs: each type URL of the contract is the one anypb gives its message.
func TestTypeURLs(t *testing.T) {
	for url, m := range map[string]proto.Message{
		agentv1.TypeNameTable:      &ndsv1.NameTable{},
		agentv1.TypeProxyConfig:    &meshv1.ProxyConfig{},
		agentv1.TypeWorkloadHealth: &agentv1.WorkloadHealth{},
		agentv1.TypeTrustBundle:    &agentv1.TrustBundle{},
	} {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		if a.GetTypeUrl() != url {
			t.Errorf("type URL %q, want anypb's %q", url, a.GetTypeUrl())
		}
	}
}
