package component

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/agentd/agentd/internal/bus"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// TestFollowSubscribesAgain: a bus stream that breaks (the server gone, then back) is
// subscribed to again, and the message published meanwhile arrives, replayed.
func TestFollowSubscribesAgain(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "bus.sock")
	b := bus.New()
	serve := func() *grpc.Server {
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		agentv1.RegisterBusServer(g, b.Server())
		go g.Serve(l)
		return g
	}
	g := serve()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := make(chan string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		NewBus(agentv1.NewBusClient(conn)).Follow(ctx, "t", hclog.NewNullLogger(), func(m *agentv1.BusMessage) {
			var v wrapperspb.StringValue
			m.GetPayload().UnmarshalTo(&v)
			got <- v.GetValue()
		})
	}()
	publish := func(v string) {
		p, _ := anypb.New(wrapperspb.String(v))
		if _, err := b.Publish("t", p); err != nil {
			t.Fatal(err)
		}
	}
	want := func(v string) {
		t.Helper()
		for {
			select {
			case m := <-got:
				if m == v {
					return
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("Follow did not deliver %q", v)
			}
		}
	}
	publish("a")
	want("a")
	g.Stop() // breaks the stream
	publish("b")
	g = serve()
	defer g.Stop()
	want("b")
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return after its context ended")
	}
}
