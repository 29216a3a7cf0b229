// Command sample-client is the proxyless gRPC client of the quickstart (`make run`): it
// resolves an xds:/// target through the gRPC xDS bootstrap agentd writes (GRPC_XDS_BOOTSTRAP,
// which gRPC reads when the process starts) and calls the backend's health service.
// `sample-client ecds SOCKET NAME...` shows instead what agentd's xDS proxy gives Envoy for
// ECDS resources (ecds.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and balancers
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "ecds" {
		os.Exit(ecdsMain(os.Args[2:]))
	}
	target := flag.String("target", "xds:///reviews.default.svc.cluster.local:9080", "gRPC target")
	count := flag.Int("count", 3, "number of calls")
	timeout := flag.Duration("timeout", 30*time.Second, "deadline of all the calls together")
	flag.Parse()
	if os.Getenv("GRPC_XDS_BOOTSTRAP") == "" && os.Getenv("GRPC_XDS_BOOTSTRAP_CONFIG") == "" {
		fmt.Fprintln(os.Stderr, "sample-client: set GRPC_XDS_BOOTSTRAP to the bootstrap agentd wrote (<root>/etc/istio/proxy/grpc-bootstrap.json)")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := run(ctx, *target, *count); err != nil {
		fmt.Fprintln(os.Stderr, "sample-client:", err)
		os.Exit(1)
	}
}

// run makes count health checks on target and prints which backend answered each.
func run(ctx context.Context, target string, count int) error {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("client for %s: %w", target, err)
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)
	for i := range count {
		var p peer.Peer
		start := time.Now()
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(true))
		if err != nil {
			return fmt.Errorf("call %d to %s: %w", i+1, target, err)
		}
		fmt.Printf("call %d: %s answered %s in %v\n", i+1, p.Addr, resp.GetStatus(), time.Since(start).Round(time.Microsecond))
	}
	return nil
}
