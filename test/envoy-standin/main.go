// Command envoy-standin is a TEST STAND-IN FOR ENVOY, not Envoy: Envoy cannot be installed on
// the machines agentd is developed and tested on, so agentd's tests run this small Go program
// where they would run envoy. It takes Envoy's command line, parses and validates the
// bootstrap with go-control-plane (Any payloads included), serves the admin endpoints agentd
// uses with Envoy's semantics (/ready, /stats text, /stats/prometheus, /drain_listeners,
// /quitquitquit, /server_info), opens the ADS stream (SotW or delta, as the bootstrap says) on
// the xds-grpc cluster and an SDS stream on the sds-grpc cluster as a real xDS client that
// ACKs what it applies and NACKs what fails validation, serves the bootstrap's static HTTP
// listeners (readiness on 15021 routed to the agent, Prometheus on 15090), and accepts TCP
// connections on the listeners LDS gives it, counting downstream_cx_active so that a drain
// can wait for them. It forwards no traffic: connections on LDS listeners are held open and
// echoed until the client closes them. When a real envoy is on PATH the end-to-end tests use
// it instead.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	if err := record(os.Getenv("ENVOY_STANDIN_RECORD"), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "envoy-standin:", err)
		os.Exit(1)
	}
	opts, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "envoy-standin:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, opts); err != nil {
		logf("critical", "main", "%v", err)
		os.Exit(1)
	}
}

// record, when dir is set (ENVOY_STANDIN_RECORD), writes what the stand-in was started with,
// as the recordings of Istio's pilot-agent have it: envoy-argv.txt (one argument a line),
// bootstrap.json (the -c file, as given), envoy-cwd.txt and envoy-environ (its environment,
// NUL-separated). Compatibility tests compare them.
func record(dir string, args []string) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	files := map[string][]byte{
		"envoy-argv.txt": []byte(strings.Join(args, "\n") + "\n"),
		"envoy-environ":  []byte(strings.Join(os.Environ(), "\x00")),
	}
	if wd, err := os.Getwd(); err == nil {
		files["envoy-cwd.txt"] = []byte(wd + "\n")
	}
	for i, a := range args {
		if (a == "-c" || a == "--config-path") && i+1 < len(args) {
			data, err := os.ReadFile(args[i+1])
			if err != nil {
				return fmt.Errorf("record the bootstrap: %w", err)
			}
			files["bootstrap.json"] = data
		}
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("record: %w", err)
		}
	}
	return nil
}

// options are the Envoy flags the stand-in reads; the others are accepted and ignored.
type options struct {
	configPath        string
	configYAML        string
	drainTimeS        int
	drainStrategy     string
	ipVersion         string
	logLevel          string
	componentLogLevel string
	concurrency       int
	args              []string
}

func parseFlags(args []string) (*options, error) {
	o := &options{args: args}
	fs := flag.NewFlagSet("envoy", flag.ContinueOnError)
	fs.StringVar(&o.configPath, "c", "", "bootstrap file")
	fs.StringVar(&o.configPath, "config-path", "", "bootstrap file")
	fs.StringVar(&o.configYAML, "config-yaml", "", "bootstrap fragment merged over the file")
	fs.IntVar(&o.drainTimeS, "drain-time-s", 600, "drain time in seconds")
	fs.StringVar(&o.drainStrategy, "drain-strategy", "gradual", "gradual or immediate")
	fs.StringVar(&o.ipVersion, "local-address-ip-version", "v4", "v4 or v6")
	fs.StringVar(&o.logLevel, "l", "info", "log level")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level")
	fs.StringVar(&o.componentLogLevel, "component-log-level", "", "component log levels")
	fs.IntVar(&o.concurrency, "concurrency", 2, "worker threads")
	for _, name := range []string{"disable-hot-restart", "allow-unknown-static-fields", "skip-deprecated-logs", "enable-core-dump", "reject-unknown-dynamic-fields"} {
		fs.Bool(name, false, "accepted")
	}
	for _, name := range []string{"file-flush-interval-msec", "file-flush-min-size-kb", "parent-shutdown-time-s", "restart-epoch", "base-id"} {
		fs.Int(name, 0, "accepted")
	}
	for _, name := range []string{"log-format", "service-cluster", "service-node", "service-zone", "log-path", "mode"} {
		fs.String(name, "", "accepted")
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.configPath == "" && o.configYAML == "" {
		return nil, fmt.Errorf("at least one of --config-path or --config-yaml must be given")
	}
	if o.drainStrategy != "gradual" && o.drainStrategy != "immediate" {
		return nil, fmt.Errorf("unknown drain strategy %q", o.drainStrategy)
	}
	return o, nil
}

// logf prints a line in Envoy's default log format.
func logf(level, component, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintf(os.Stderr, "[%s][%d][%s][%s] %s\n", timestamp(), os.Getpid(), level, component, strings.TrimSpace(msg))
}
