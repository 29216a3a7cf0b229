package bus

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/agentd/agentd/internal/component"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func str(s string) *anypb.Any {
	a, _ := anypb.New(wrapperspb.String(s))
	return a
}

func value(m *agentv1.BusMessage) string {
	var v wrapperspb.StringValue
	m.GetPayload().UnmarshalTo(&v)
	return v.GetValue()
}

// collect subscribes and sends every value it gets on a channel.
func collect(t *testing.T, b *Broker, topics ...string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan string, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Subscribe(ctx, topics, func(m *agentv1.BusMessage) error { out <- m.Topic + "=" + value(m); return nil })
	}()
	t.Cleanup(func() { cancel(); <-done })
	return out
}

func next(t *testing.T, c <-chan string) string {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("no message")
		return ""
	}
}

func TestRetainedReplayAndOrder(t *testing.T) {
	b := New()
	b.Publish("a", str("a1"))
	b.Publish("b", str("b1"))
	b.Publish("a", str("a2"))
	c := collect(t, b, "a", "b", "c")
	// The retained message of each topic, in publication order; a1 was replaced.
	if got := next(t, c); got != "b=b1" {
		t.Errorf("first = %q, want b=b1", got)
	}
	if got := next(t, c); got != "a=a2" {
		t.Errorf("second = %q, want a=a2", got)
	}
	b.Publish("c", str("c1"))
	b.Publish("other", str("x"))
	if got := next(t, c); got != "c=c1" {
		t.Errorf("live = %q, want c=c1", got)
	}
	select {
	case got := <-c:
		t.Errorf("got %q from a topic not subscribed", got)
	case <-time.After(50 * time.Millisecond):
	}
	if r := b.Retained("a"); value(r) != "a2" {
		t.Errorf("Retained(a) = %q, want a2", value(r))
	}
}

func TestSlowSubscriberDoesNotBlockPublisher(t *testing.T) {
	b := New()
	release := make(chan struct{})
	var mu sync.Mutex
	var got []string
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Subscribe(ctx, []string{"t"}, func(m *agentv1.BusMessage) error {
			<-release
			mu.Lock()
			got = append(got, value(m))
			mu.Unlock()
			return nil
		})
	}()
	for i := range 1000 {
		if _, err := b.Publish("t", str(string(rune('a'+i%26)))); err != nil {
			t.Fatal(err)
		}
	}
	b.Publish("t", str("last"))
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		last := ""
		if n > 0 {
			last = got[n-1]
		}
		mu.Unlock()
		if last == "last" {
			if n > 3 {
				t.Errorf("slow subscriber got %d messages, want the intermediate ones coalesced", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slow subscriber never got the last message (got %d)", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
}

func TestWrongPayloadTypeRefused(t *testing.T) {
	b := New()
	if _, err := b.Publish(agentv1.TopicNameTable, str("not a table")); err == nil {
		t.Fatal("a StringValue was accepted as the name table")
	}
	if b.Retained(agentv1.TopicNameTable) != nil {
		t.Fatal("the refused message was retained")
	}
	table, _ := anypb.New(&ndsv1.NameTable{})
	if _, err := b.Publish(agentv1.TopicNameTable, table); err != nil {
		t.Fatalf("a NameTable was refused: %v", err)
	}
	if _, err := b.Publish("", table); err == nil {
		t.Fatal("an empty topic was accepted")
	}
}

func TestOverGRPC(t *testing.T) {
	b := New()
	l, err := net.Listen("unix", t.TempDir()+"/bus.sock")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterBusServer(srv, b.Server())
	go srv.Serve(l)
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := component.NewBus(agentv1.NewBusClient(conn))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.Publish(ctx, "t", wrapperspb.String("hello")); err != nil {
		t.Fatal(err)
	}
	if err := client.Publish(ctx, agentv1.TopicNameTable, wrapperspb.String("bad")); err == nil {
		t.Error("a wrong payload type was accepted over gRPC")
	}
	got := make(chan string, 1)
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- client.Subscribe(sctx, []string{"t"}, func(m *agentv1.BusMessage) { got <- value(m); stop() })
	}()
	if v := <-got; v != "hello" {
		t.Errorf("subscriber got %q, want the retained hello", v)
	}
	if err := <-done; err != nil {
		t.Errorf("Subscribe after cancel = %v, want nil", err)
	}
}
