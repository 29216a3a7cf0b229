// Package bus is agentd's message bus: helpers publish on topics, and agentd keeps the last
// message of each topic and replays it to every new subscriber, so a restarted helper gets the
// current state (the name table, the trust bundle, the workload's health) at once.
package bus

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/memory"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// Broker is the bus. It serves helpers over gRPC (agentv1.BusServer) and agentd in-process.
//
// A subscriber that reads slowly is never a reason to block a publisher: each subscriber holds
// at most the newest undelivered message of each topic, so it may skip intermediate states but
// always ends at the latest one. Every topic carries state, not events.
type Broker struct {
	mu       sync.Mutex
	seq      uint64
	retained map[string]*agentv1.BusMessage
	subs     map[*subscriber]struct{}
}

// New returns an empty bus.
func New() *Broker {
	return &Broker{retained: map[string]*agentv1.BusMessage{}, subs: map[*subscriber]struct{}{}}
}

type subscriber struct {
	topics  map[string]bool
	pending map[string]*agentv1.BusMessage // guarded by Broker.mu
	wake    chan struct{}                  // buffered 1
}

// Publish retains payload as the topic's last message and hands it to the subscribers.
func (b *Broker) Publish(topic string, payload *anypb.Any) (*agentv1.BusMessage, error) {
	if topic == "" {
		return nil, fmt.Errorf("publish: empty topic")
	}
	if want, ok := agentv1.TopicPayloads[topic]; ok && payload.GetTypeUrl() != want {
		return nil, fmt.Errorf("publish %s: payload is %q, want %q", topic, payload.GetTypeUrl(), want)
	}
	if len(payload.GetValue()) >= memory.Large {
		defer memory.Release() // its decoding's garbage, and the message it replaces
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	m := &agentv1.BusMessage{Topic: topic, Payload: payload, Sequence: b.seq}
	b.retained[topic] = m
	for s := range b.subs {
		if s.topics[topic] {
			s.pending[topic] = m
			s.notify()
		}
	}
	return m, nil
}

// Retained returns the last message of topic, or nil.
func (b *Broker) Retained(topic string) *agentv1.BusMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.retained[topic]
}

// Subscribe calls fn with the retained message of each topic, then with every newer one, in
// sequence order, until ctx ends. It returns ctx's error, or fn's.
func (b *Broker) Subscribe(ctx context.Context, topics []string, fn func(*agentv1.BusMessage) error) error {
	s := &subscriber{topics: map[string]bool{}, pending: map[string]*agentv1.BusMessage{}, wake: make(chan struct{}, 1)}
	b.mu.Lock()
	for _, t := range topics {
		s.topics[t] = true
		if m := b.retained[t]; m != nil {
			s.pending[t] = m
		}
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	s.notify()
	defer func() {
		b.mu.Lock()
		delete(b.subs, s)
		b.mu.Unlock()
	}()

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.wake:
		}
		for _, m := range b.take(s) {
			if err := fn(m); err != nil {
				return err
			}
		}
	}
}

// take empties s's pending messages, oldest first.
func (b *Broker) take(s *subscriber) []*agentv1.BusMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*agentv1.BusMessage, 0, len(s.pending))
	for t, m := range s.pending {
		out = append(out, m)
		delete(s.pending, t)
	}
	slices.SortFunc(out, func(a, b *agentv1.BusMessage) int { return cmp.Compare(a.Sequence, b.Sequence) })
	return out
}

func (s *subscriber) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Server returns the bus as the gRPC service agentd serves to its helpers.
func (b *Broker) Server() agentv1.BusServer { return grpcServer{b: b} }

type grpcServer struct {
	agentv1.UnimplementedBusServer
	b *Broker
}

func (g grpcServer) Publish(_ context.Context, req *agentv1.PublishRequest) (*agentv1.PublishResponse, error) {
	if _, err := g.b.Publish(req.GetTopic(), req.GetPayload()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &agentv1.PublishResponse{}, nil
}

func (g grpcServer) Subscribe(req *agentv1.SubscribeRequest, stream agentv1.Bus_SubscribeServer) error {
	err := g.b.Subscribe(stream.Context(), req.GetTopics(), stream.Send)
	if stream.Context().Err() != nil {
		return nil
	}
	return err
}
