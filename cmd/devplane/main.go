// Command devplane is a small local stand-in for istiod: xDS and NDS for the services of a
// YAML file, and a CA (Istio's CA API), for the quickstart, the tests and the benchmarks.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agentd/agentd/internal/testing/ca"
	"github.com/agentd/agentd/internal/testing/devplane"
)

func main() {
	var cfg devplane.Config
	flag.StringVar(&cfg.XDSAddress, "xds-address", "127.0.0.1:15010", "address to serve xDS (ADS) on")
	flag.StringVar(&cfg.ServicesFile, "services", "", "services YAML file, reloaded when it changes")
	flag.StringVar(&cfg.DebugAddress, "debug-address", "127.0.0.1:15014", "address of the debug HTTP server (/debug/health, /debug/nacks) and of the sample Wasm module (/wasm/sample.wasm); empty for none")
	flag.StringVar(&cfg.CAAddress, "ca-address", "", "address to serve the CA on over TLS (istiod: 15012); empty serves it in plaintext beside xDS")
	caRoot := flag.String("ca-root-out", "", "file to write the CA's root certificate to (agentd's CA_ROOT_CA)")
	certTTL := flag.Duration("cert-ttl", 24*time.Hour, "longest workload certificate lifetime the CA issues")
	level := flag.String("log-level", "info", "log level")
	flag.Parse()
	if cfg.ServicesFile == "" {
		fmt.Fprintln(os.Stderr, "devplane: --services is required")
		os.Exit(2)
	}
	cfg.Log = hclog.New(&hclog.LoggerOptions{Name: "devplane", Level: hclog.LevelFromString(*level)})
	authority, err := ca.New(ca.Options{RootFile: *caRoot, TTL: *certTTL, Log: cfg.Log.Named("ca")})
	if err != nil {
		cfg.Log.Error("devplane CA", "error", err)
		os.Exit(1)
	}
	cfg.Register, cfg.CATLS = append(cfg.Register, authority.Register), authority.ServerTLS()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := devplane.Run(ctx, cfg); err != nil {
		cfg.Log.Error("devplane failed", "error", err)
		os.Exit(1)
	}
}
