// Command sample-backend is the gRPC backend of the quickstart (`make run`): it serves the
// standard gRPC health service, so that any gRPC client can call it and see who answered.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	addr := flag.String("address", "127.0.0.1:50051", "address to serve gRPC on")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr); err != nil {
		fmt.Fprintln(os.Stderr, "sample-backend:", err)
		os.Exit(1)
	}
}

// run serves the health service on addr until ctx ends.
func run(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() {
		<-ctx.Done()
		s.GracefulStop()
	}()
	fmt.Fprintf(os.Stderr, "sample-backend: serving grpc.health.v1.Health on %s\n", l.Addr())
	return s.Serve(l)
}
