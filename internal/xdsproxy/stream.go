package xdsproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/memory"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// flavour is what differs between SotW and delta xDS.
type flavour struct {
	name   string
	method string // the upstream method
	// Where requests and responses keep their type_url.
	requestTypeURL, responseTypeURL func() protowire.Number
	// request builds a request of the proxy's own: a subscription or a health report.
	request func(typeURL string, detail *status.Status) proto.Message
	// consume decodes a response of a type the proxy handles, hands its first resource to
	// handle and returns the ACK (or NACK) for it; nil for a response without resources,
	// which Istio ignores.
	consume func(data []byte, handle func(*anypb.Any) error) (proto.Message, error)
	// rewrite re-encodes an ECDS response after convert, or returns its NACK (ecds.go).
	rewrite func(data []byte, lastAck string, convert func([]*anypb.Any) error) ([]byte, proto.Message, error)
}

// typeURLField is where m keeps its type_url, looked up on first use: the lookup builds the
// descriptors of m's whole file (40 KB of heap), which every process of agentd's executable
// would otherwise build at start, used or not.
func typeURLField(m proto.Message) func() protowire.Number {
	return fieldNumber(m, "type_url")
}

// fieldNumber is the number of m's field name, looked up once, on first use.
func fieldNumber(m proto.Message, name protoreflect.Name) func() protowire.Number {
	return sync.OnceValue(func() protowire.Number {
		return m.ProtoReflect().Descriptor().Fields().ByName(name).Number()
	})
}

var sotw = &flavour{
	name:            "sotw",
	method:          "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
	requestTypeURL:  typeURLField(&discoveryv3.DiscoveryRequest{}),
	responseTypeURL: typeURLField(&discoveryv3.DiscoveryResponse{}),
	request: func(typeURL string, detail *status.Status) proto.Message {
		return &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, ErrorDetail: detail}
	},
	consume: func(data []byte, handle func(*anypb.Any) error) (proto.Message, error) {
		r := &discoveryv3.DiscoveryResponse{}
		if err := proto.Unmarshal(data, r); err != nil {
			return nil, err
		}
		if len(r.Resources) == 0 {
			return nil, nil
		}
		return &discoveryv3.DiscoveryRequest{
			VersionInfo: r.VersionInfo, TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce,
			ErrorDetail: nack(handle(r.Resources[0])),
		}, nil
	},
	rewrite: sotwRewrite,
}

var delta = &flavour{
	name:            "delta",
	method:          "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
	requestTypeURL:  typeURLField(&discoveryv3.DeltaDiscoveryRequest{}),
	responseTypeURL: typeURLField(&discoveryv3.DeltaDiscoveryResponse{}),
	request: func(typeURL string, detail *status.Status) proto.Message {
		return &discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, ErrorDetail: detail}
	},
	consume: func(data []byte, handle func(*anypb.Any) error) (proto.Message, error) {
		r := &discoveryv3.DeltaDiscoveryResponse{}
		if err := proto.Unmarshal(data, r); err != nil {
			return nil, err
		}
		if len(r.Resources) == 0 {
			return nil, nil
		}
		return &discoveryv3.DeltaDiscoveryRequest{
			TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce,
			ErrorDetail: nack(handle(r.Resources[0].GetResource())),
		}, nil
	},
	rewrite: deltaRewrite,
}

// nack is the error detail of a NACK for err: code 13 (INTERNAL), as Istio sends.
func nack(err error) *status.Status {
	if err == nil {
		return nil
	}
	return &status.Status{Code: int32(codes.Internal), Message: err.Error()}
}

// healthRequest is a health report: healthy without error detail, unhealthy with code 13.
func (f *flavour) healthRequest(h *agentv1.WorkloadHealth) proto.Message {
	if h.GetHealthy() {
		return f.request(HealthInfoType, nil)
	}
	return f.request(HealthInfoType, &status.Status{Code: int32(codes.Internal), Message: h.GetMessage()})
}

// session is one proxied stream as SetHealth sees it.
type session struct {
	report func(*agentv1.WorkloadHealth)
}

// pipe is one downstream stream joined to its upstream stream.
type pipe struct {
	p    *Proxy
	f    *flavour
	log  hclog.Logger
	down grpc.ServerStream
	up   grpc.ClientStream

	requests    *queue[any]    // *frame from the client, proto.Message of the proxy's own
	responses   chan *frame    // at most one response waits while another is handled
	initialSent atomic.Bool    // the client's first LDS request has passed
	ended       chan endReason // the first end of either side wins

	ecds      *queue[*frame]         // ECDS responses waiting for their Wasm modules
	converted chan *frame            // ECDS responses ready for the client
	ecdsAck   atomic.Pointer[string] // the version of the client's last ECDS ACK
}

// endReason is how a stream ended and which side ended it.
type endReason struct {
	upstream bool
	err      error
}

// proxy serves one downstream stream: it opens an upstream stream of the same flavour on a
// connection of its own, and ends both when either ends.
func (p *Proxy) proxy(f *flavour, down grpc.ServerStream) error {
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	log := p.log.With("stream", p.streams.Add(1), "xds", f.name)

	opts, err := p.cfg.Upstream.dialOptions(log)
	if err == nil {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec{})))
	}
	var conn *grpc.ClientConn
	if err == nil {
		conn, err = grpc.NewClient(p.cfg.Upstream.Address, opts...)
	}
	var up grpc.ClientStream
	if err == nil {
		defer conn.Close()
		up, err = conn.NewStream(p.cfg.Upstream.outgoing(ctx),
			&grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, f.method)
	}
	if err != nil {
		p.metrics.upstreamFailures.WithLabelValues().Inc()
		log.Warn("cannot reach the control plane", "address", p.cfg.Upstream.Address, "error", err)
		return fmt.Errorf("connect to the control plane %s: %w", p.cfg.Upstream.Address, err)
	}
	log.Debug("connected upstream", "address", p.cfg.Upstream.Address)

	s := &pipe{
		p: p, f: f, log: log, down: down, up: up,
		requests:  newQueue[any](),
		responses: make(chan *frame, 1),
		ended:     make(chan endReason, 4),
		ecds:      newQueue[*frame](),
		converted: make(chan *frame),
	}
	sess := &session{report: s.reportHealth}
	p.mu.Lock()
	p.sessions[sess] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.sessions, sess)
		p.mu.Unlock()
	}()
	return s.run(ctx, cancel)
}

func (s *pipe) run(ctx context.Context, cancel context.CancelFunc) error {
	// Receiving from the client is the only goroutine not waited for: Recv returns only once
	// the handler has returned, and then at once.
	go s.receiveRequests()
	var wg sync.WaitGroup
	for _, w := range []func(context.Context){s.sendRequests, s.receiveResponses, s.handleResponses, s.convertECDS} {
		wg.Go(func() { w(ctx) })
	}
	var end endReason
	select {
	case end = <-s.ended:
	case <-ctx.Done():
		end = endReason{err: ctx.Err()}
	}
	cancel()
	wg.Wait()
	return s.p.finish(s.log, end)
}

// end records how the stream ended; only the first call matters.
func (s *pipe) end(upstream bool, err error) {
	select {
	case s.ended <- endReason{upstream: upstream, err: err}:
	default:
	}
}

func (s *pipe) receiveRequests() {
	for {
		req := &frame{typeURLField: s.f.requestTypeURL()}
		if err := s.down.RecvMsg(req); err != nil {
			s.end(false, err)
			return
		}
		s.noteECDSRequest(req)
		s.requests.put(req)
		if !s.initialSent.Load() && req.typeURL == ListenerType {
			s.sendInitialRequests()
		}
	}
}

// sendInitialRequests follows the client's first LDS request with the proxy's own
// subscriptions and the last health report, as Istio does.
func (s *pipe) sendInitialRequests() {
	if s.p.cfg.NameTable {
		s.requests.put(s.f.request(agentv1.TypeNameTable, nil))
	}
	if s.p.cfg.ProxyConfig {
		s.requests.put(s.f.request(agentv1.TypeProxyConfig, nil))
	}
	s.initialSent.Store(true)
	if h := s.p.currentHealth(); h != nil {
		s.requests.put(s.f.healthRequest(h))
	}
}

// reportHealth sends a health report, unless the stream has not passed its first LDS request
// yet (it then goes with the initial requests).
func (s *pipe) reportHealth(h *agentv1.WorkloadHealth) {
	if s.initialSent.Load() {
		s.requests.put(s.f.healthRequest(h))
	}
}

func (s *pipe) sendRequests(ctx context.Context) {
	for {
		req, ok := s.requests.get(ctx)
		if !ok {
			return
		}
		s.p.metrics.requests.Inc()
		if err := s.up.SendMsg(req); err != nil {
			if !errors.Is(err, io.EOF) { // io.EOF: the stream broke; Recv tells why
				s.end(true, fmt.Errorf("send upstream: %w", err))
			}
			return
		}
	}
}

func (s *pipe) receiveResponses(ctx context.Context) {
	for {
		resp := &frame{typeURLField: s.f.responseTypeURL()}
		if err := s.up.RecvMsg(resp); err != nil {
			s.end(true, err)
			return
		}
		select {
		case s.responses <- resp:
		case <-ctx.Done():
			return
		}
	}
}

func (s *pipe) handleResponses(ctx context.Context) {
	for {
		select {
		case resp := <-s.responses:
			if err := s.handleResponse(ctx, resp); err != nil {
				s.end(false, err)
				return
			}
		case resp := <-s.converted:
			if err := s.forward(resp); err != nil {
				s.end(false, err)
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// handleResponse consumes a response of a type the proxy handles and acknowledges it
// upstream, forwards an Envoy type to the client, and drops anything else.
func (s *pipe) handleResponse(ctx context.Context, resp *frame) error {
	s.p.metrics.responses.Inc()
	if len(resp.data) >= memory.Large {
		defer memory.Release()
	}
	if h := s.p.handler(resp.typeURL); h != nil {
		ack, err := s.f.consume(resp.data, func(a *anypb.Any) error {
			err := h(ctx, a)
			if err != nil {
				s.log.Warn("rejecting a response of the control plane", "type", resp.typeURL, "error", err)
			}
			return err
		})
		if err != nil {
			s.log.Error("dropping a malformed response of the control plane", "type", resp.typeURL, "error", err)
			return nil
		}
		if ack != nil {
			s.requests.put(ack)
		}
		return nil
	}
	if !forwarded(resp.typeURL) {
		s.log.Error("not forwarding a response of a type that is not Envoy's", "type", resp.typeURL)
		return nil
	}
	if resp.typeURL == ExtensionConfigType && s.p.cfg.Wasm != nil {
		s.ecds.put(resp)
		return nil
	}
	return s.forward(resp)
}

// forward sends a response to the client.
func (s *pipe) forward(resp *frame) error {
	start := time.Now()
	err := s.down.SendMsg(resp)
	if d := time.Since(start); d > slowSend {
		s.log.Warn("slow send to the client", "type", resp.typeURL, "took", d)
	}
	if err != nil {
		return fmt.Errorf("send to the client: %w", err)
	}
	return nil
}

// finish counts and logs how a stream ended and returns what its client should see: nothing
// for a graceful end of either side (the client reconnects), else the error.
func (p *Proxy) finish(log hclog.Logger, end endReason) error {
	side, counter := "client", p.metrics.downstreamEnds
	if end.upstream {
		side, counter = "control plane", p.metrics.upstreamEnds
	}
	if expectedEnd(end.err) {
		counter.WithLabelValues("cancelled").Inc()
		log.Debug("stream ended by the "+side, "status", end.err)
	} else {
		counter.WithLabelValues("error").Inc()
		log.Warn("stream ended by the "+side+" with an unexpected error", "error", end.err)
	}
	if errors.Is(end.err, io.EOF) {
		return nil
	}
	return end.err
}
