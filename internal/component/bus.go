package component

import (
	"time"

	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"

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

// Follow calls fn with the retained message of topic, then with every new one, until ctx
// ends: a subscription that breaks (agentd's bus restarting its stream, a broken connection)
// is made again with backoff, logged by log. The bus replays the topic's current message, so
// nothing published meanwhile is missed. Every subscriber of a helper follows its topic so.
func (b *Bus) Follow(ctx context.Context, topic string, log hclog.Logger, fn func(*agentv1.BusMessage)) {
	wait := followBackoff
	for {
		err := b.Subscribe(ctx, []string{topic}, fn)
		if ctx.Err() != nil {
			return
		}
		log.Warn("bus subscription ended, subscribing again", "topic", topic, "error", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// followBackoff is Follow's first wait before it subscribes again.
var followBackoff = 50 * time.Millisecond

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
