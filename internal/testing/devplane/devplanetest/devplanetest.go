// Package devplanetest holds what the xDS tests share: a devplane served in-process, real
// gRPC backends, and real proxyless gRPC clients resolving xds:/// targets.
package devplanetest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"

	"github.com/agentd/agentd/internal/grpcbootstrap"
	"github.com/agentd/agentd/internal/testing/devplane"
)

// Target is the proxyless target of the test service.
const Target = "xds:///reviews.default.svc.cluster.local:9080"

// Services is the test service with its endpoints at the given backend addresses.
func Services(t testing.TB, backends ...string) []devplane.Service {
	t.Helper()
	var eps []devplane.Endpoint
	for _, b := range backends {
		host, port := splitHostPort(t, b)
		eps = append(eps, devplane.Endpoint{Address: host, Port: port})
	}
	return []devplane.Service{{
		Hostname:  "reviews.default.svc.cluster.local",
		Namespace: "default",
		Registry:  "Kubernetes",
		Addresses: []string{"10.96.0.12"},
		Ports:     []devplane.Port{{Name: "grpc", Port: 9080, Protocol: "GRPC"}},
		Endpoints: eps,
	}}
}

// Devplane serves a devplane with services on a loopback port until the test ends, and
// returns its address.
func Devplane(t testing.TB, services []devplane.Service) (string, *devplane.Server) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l.Addr().String(), ServeDevplane(t, l, services)
}

// ServeDevplane serves a devplane with services on l until the test ends.
func ServeDevplane(t testing.TB, l net.Listener, services []devplane.Service) *devplane.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := devplane.New(ctx, hclog.NewNullLogger())
	if err := s.Update(ctx, services); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("devplane: %v", err)
		}
	})
	return s
}

// Backend serves the gRPC health service on a loopback port until the test ends, and
// returns its address. Which backend answered a call shows in its peer address.
func Backend(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(l) // ends with Stop below
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return l.Addr().String()
}

// Bootstrap is the JSON of a proxyless client's bootstrap for the xDS server at serverURI.
func Bootstrap(t testing.TB, serverURI string) []byte {
	t.Helper()
	data, err := grpcbootstrap.New(grpcbootstrap.Options{
		ServerURI: serverURI,
		NodeID:    "sidecar~127.0.0.1~app-1.default~default.svc.cluster.local",
		Metadata:  map[string]any{"NAMESPACE": "default", "CLUSTER_ID": "Kubernetes"},
	}).JSON()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Dial makes a proxyless gRPC client of target with bootstrap, closed when the test ends.
func Dial(t testing.TB, bootstrap []byte, target string) *grpc.ClientConn {
	t.Helper()
	resolver, err := xds.NewXDSResolverWithConfigForTesting(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(target, grpc.WithResolvers(resolver), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// Call makes one RPC on cc and returns the address of the backend that answered it.
func Call(ctx context.Context, cc *grpc.ClientConn) (string, error) {
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return "", err
	}
	return p.Addr.String(), nil
}

// WaitBackend calls cc until backend answers, failing the test after a deadline.
func WaitBackend(t testing.TB, cc *grpc.ClientConn, backend string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got string
	var err error
	for ctx.Err() == nil {
		callCtx, callCancel := context.WithTimeout(ctx, 5*time.Second)
		got, err = Call(callCtx, cc)
		callCancel()
		if err == nil && got == backend {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("calls never reached backend %s: last answer from %q, error %v", backend, got, err)
}

func splitHostPort(t testing.TB, addr string) (string, uint32) {
	t.Helper()
	ap, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ap.IP.String(), uint32(ap.Port)
}
