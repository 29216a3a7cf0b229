package component

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// Bus is a helper's client of the bus agentd serves.
type Bus struct {
	client agentv1.BusClient
}

// NewBus wraps a Bus client; tests use it with a bus served in-process.
func NewBus(c agentv1.BusClient) *Bus { return &Bus{client: c} }

// Publish sends m on topic; agentd keeps it as the topic's retained message.
func (b *Bus) Publish(ctx context.Context, topic string, m proto.Message) error {
	payload, err := anypb.New(m)
	if err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	if _, err := b.client.Publish(ctx, &agentv1.PublishRequest{Topic: topic, Payload: payload}); err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	return nil
}

// Subscribe calls fn with the retained message of each topic, then with every new one, until
// ctx ends or the stream breaks. fn runs on one goroutine, in order.
func (b *Bus) Subscribe(ctx context.Context, topics []string, fn func(*agentv1.BusMessage)) error {
	stream, err := b.client.Subscribe(ctx, &agentv1.SubscribeRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("subscribe %v: %w", topics, err)
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("subscription %v: %w", topics, err)
		}
		fn(m)
	}
}
