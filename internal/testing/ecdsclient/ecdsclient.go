// Package ecdsclient asks agentd for ECDS resources as Envoy does (an ADS stream on its XDS
// socket, with a sidecar's node) and says what each makes Envoy load: the quickstart's view of
// the Wasm path where no Envoy runs, and the tests' check of it.
package ecdsclient

import (
	"context"
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httprbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Type is ECDS's type URL.
const Type = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"

// Stream is an ADS stream asking for ECDS resources.
type Stream struct {
	discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	cc *grpc.ClientConn
}

// Close ends the stream and its connection.
func (s *Stream) Close() error { return s.cc.Close() }

// Subscribe opens an ADS stream (SotW) to the XDS Unix socket at path and asks for the ECDS
// resources names, as the sidecar nodeID (its metadata names Envoy's generator, for which a
// control plane serves ECDS). The stream ends with ctx.
func Subscribe(ctx context.Context, socket, nodeID string, names []string) (*Stream, error) {
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", socket, err)
	}
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err == nil {
		node := &corev3.Node{Id: nodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"GENERATOR": structpb.NewStringValue("envoy"),
		}}}
		err = s.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: Type, ResourceNames: names})
	}
	if err != nil {
		cc.Close()
		return nil, fmt.Errorf("asking %s for ECDS: %w", socket, err)
	}
	return &Stream{AggregatedDiscoveryService_StreamAggregatedResourcesClient: s, cc: cc}, nil
}

// Loads says what an ECDS resource makes Envoy load, with the resource's name:
// "file:<path>", "allow" or "deny" (Istio's RBAC fallbacks of a module that could not be
// fetched), "remote" (which must never reach Envoy) or "other".
func Loads(a *anypb.Any) (name, what string, err error) {
	ec := &corev3.TypedExtensionConfig{}
	if err := a.UnmarshalTo(ec); err != nil {
		return "", "", fmt.Errorf("decoding an extension config: %w", err)
	}
	m, err := ec.GetTypedConfig().UnmarshalNew()
	if err != nil {
		return ec.GetName(), "", fmt.Errorf("decoding extension config %s: %w", ec.GetName(), err)
	}
	switch m := m.(type) {
	case *httpwasm.Wasm:
		if code := m.GetConfig().GetVmConfig().GetCode(); code.GetLocal() != nil {
			return ec.GetName(), "file:" + code.GetLocal().GetFilename(), nil
		}
		return ec.GetName(), "remote", nil
	case *httprbac.RBAC:
		switch {
		case m.GetRules() == nil && m.GetRulesStatPrefix() == "wasm-default-allow":
			return ec.GetName(), "allow", nil
		case m.GetRules() != nil && len(m.GetRules().GetPolicies()) == 0 && m.GetRulesStatPrefix() == "wasm-default-deny":
			return ec.GetName(), "deny", nil
		}
	}
	return ec.GetName(), "other", nil
}
