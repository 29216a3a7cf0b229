package xdsproxy

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/testing/devplane/devplanetest"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

func TestConfigFrom(t *testing.T) {
	got := configFrom(&agentv1.XDSProxyConfig{
		DiscoveryAddress: "istiod:15012", ClusterId: "c1", Headers: map[string]string{"a": "b"}, Tls: true,
		RootCert: "/r.pem", IstiodSan: "istiod.svc", CertChain: "/c.pem", Key: "/k.pem", TokenPath: "/t", NameTable: true, ProxyConfig: true,
	})
	u := got.Upstream
	if u.Address != "istiod:15012" || u.ClusterID != "c1" || u.Headers["a"] != "b" || !u.TLS || u.RootCert != "/r.pem" ||
		u.SAN != "istiod.svc" || u.CertChain != "/c.pem" || u.Key != "/k.pem" || u.TokenPath != "/t" || !got.NameTable || !got.ProxyConfig {
		t.Errorf("configFrom = %+v", got)
	}
}

// TestHelper runs the helper as agentd does: health reports published on the bus reach the
// control plane, and after a drain the open stream keeps working while new connections go
// elsewhere.
func TestHelper(t *testing.T) {
	addr, dev := devplanetest.Devplane(t, devplanetest.Services(t, "127.0.0.1:50051"))
	b := newTestBus(t)
	p, err := NewProxy(Config{Upstream: Upstream{Address: addr}}, hclog.NewNullLogger(), b.client, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(tempDir(t), "XDS")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHelper(p, l, b.client)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	waitFor(t, "ready", func() bool { return h.Ready() == nil })

	health, _ := anypb.New(&agentv1.WorkloadHealth{Healthy: false, Message: "app down"})
	if _, err := b.broker.Publish(agentv1.TopicWorkloadHealth, health); err != nil {
		t.Fatal(err)
	}
	s := flavours[1].open(t, adsClient(t, "unix://"+sock))
	s.subscribe(t, resourcev3.ListenerType, testNode("node-helper", "envoy"))
	waitFor(t, "the report from the bus", func() bool {
		r, ok := dev.Health()["node-helper"]
		return ok && !r.Healthy && r.Message == "app down"
	})

	drainCtx, drainCancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer drainCancel()
	if err := h.Drain(drainCtx); err != nil {
		t.Fatal(err)
	}
	s.subscribe(t, resourcev3.ClusterType, nil)
	for r := s.recv(t); r.typeURL != resourcev3.ClusterType; r = s.recv(t) {
	}
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		t.Error("a drained proxy still accepts connections")
	}
}
