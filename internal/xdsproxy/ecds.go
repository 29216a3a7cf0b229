package xdsproxy

import (
	"context"
	"fmt"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/wasm"
)

// ExtensionConfigType is ECDS: Wasm filters whose remote code the proxy fetches and rewrites.
const ExtensionConfigType = wasm.ExtensionConfigType

// Converter rewrites ECDS resources in place (wasm.Converter); an error NACKs the response.
type Converter interface {
	Convert(ctx context.Context, resources []*anypb.Any) error
}

var versionInfoField = fieldNumber(&discoveryv3.DiscoveryRequest{}, "version_info")

// sotwRewrite and deltaRewrite decode an ECDS response, let convert rewrite its resources and
// return it encoded again, or, when convert fails, the NACK to send upstream instead (with
// the last version the client acknowledged, as Istio sends it).
func sotwRewrite(data []byte, lastAck string, convert func([]*anypb.Any) error) ([]byte, proto.Message, error) {
	r := &discoveryv3.DiscoveryResponse{}
	if err := proto.Unmarshal(data, r); err != nil {
		return nil, nil, err
	}
	if err := convert(r.Resources); err != nil {
		return nil, &discoveryv3.DiscoveryRequest{VersionInfo: lastAck, TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce, ErrorDetail: nack(err)}, nil
	}
	out, err := proto.Marshal(r)
	return out, nil, err
}

func deltaRewrite(data []byte, _ string, convert func([]*anypb.Any) error) ([]byte, proto.Message, error) {
	r := &discoveryv3.DeltaDiscoveryResponse{}
	if err := proto.Unmarshal(data, r); err != nil {
		return nil, nil, err
	}
	var held []*discoveryv3.Resource // resources with a body; a delta resource may have none
	var bodies []*anypb.Any
	for _, res := range r.Resources {
		if res.GetResource() != nil {
			held, bodies = append(held, res), append(bodies, res.GetResource())
		}
	}
	if err := convert(bodies); err != nil {
		return nil, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce, ErrorDetail: nack(err)}, nil
	}
	for i, res := range held {
		res.Resource = bodies[i]
	}
	out, err := proto.Marshal(r)
	return out, nil, err
}

// noteECDSRequest keeps the version of the client's last ECDS ACK (SotW; Istio keeps it for
// its NACKs).
func (s *pipe) noteECDSRequest(req *frame) {
	if req.typeURL != ExtensionConfigType || s.f != sotw {
		return
	}
	if v, err := stringField(req.data, versionInfoField()); err == nil && v != "" {
		s.ecdsAck.Store(&v)
	}
}

// convertECDS converts the ECDS responses in the order they came, beside the other types
// (a module may take its pull timeout to fetch), and hands each to handleResponses to send.
func (s *pipe) convertECDS(ctx context.Context) {
	for {
		resp, ok := s.ecds.get(ctx)
		if !ok {
			return
		}
		out, err := s.convert(ctx, resp)
		if err != nil {
			s.log.Error("dropping a malformed ECDS response of the control plane", "error", err)
			continue
		}
		if out == nil {
			continue
		}
		select {
		case s.converted <- out:
		case <-ctx.Done():
			return
		}
	}
}

// convert returns the response to forward, or nil when it was NACKed instead.
func (s *pipe) convert(ctx context.Context, resp *frame) (*frame, error) {
	var lastAck string
	if v := s.ecdsAck.Load(); v != nil {
		lastAck = *v
	}
	out, nackReq, err := s.f.rewrite(resp.data, lastAck, func(res []*anypb.Any) error {
		return s.p.cfg.Wasm.Convert(ctx, res)
	})
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if nackReq != nil {
		if ctx.Err() == nil {
			s.log.Warn("rejecting an ECDS response: a resource cannot be converted", "error", nackErr(nackReq))
			s.requests.put(nackReq)
		}
		return nil, nil
	}
	return &frame{typeURLField: resp.typeURLField, data: out, typeURL: resp.typeURL}, nil
}

func nackErr(m proto.Message) string {
	switch r := m.(type) {
	case *discoveryv3.DiscoveryRequest:
		return r.GetErrorDetail().GetMessage()
	case *discoveryv3.DeltaDiscoveryRequest:
		return r.GetErrorDetail().GetMessage()
	}
	return ""
}
