package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/agentd/agentd/internal/testing/ecdsclient"
)

// ecdsMain is `sample-client ecds SOCKET NAME...`: it asks agentd's XDS socket for ECDS
// resources as Envoy does and prints what each makes Envoy load.
func ecdsMain(args []string) int {
	fs := flag.NewFlagSet("sample-client ecds", flag.ExitOnError)
	timeout := fs.Duration("timeout", 30*time.Second, "deadline of the answer")
	node := fs.String("node", "sidecar~127.0.0.1~quickstart-1.default~default.svc.cluster.local", "node ID of the request")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: sample-client ecds [flags] SOCKET NAME...\n\nasks SOCKET (agentd's <root>/etc/istio/proxy/XDS) for the ECDS resources NAME... as Envoy does\nand prints what each makes Envoy load.")
		fs.PrintDefaults()
	}
	_ = fs.Parse(args) // ExitOnError
	if fs.NArg() < 2 {
		fs.Usage()
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := showECDS(ctx, fs.Arg(0), *node, fs.Args()[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "sample-client ecds:", err)
		return 1
	}
	return 0
}

// showECDS prints, for each of names, what agentd's answer makes Envoy load; a module file is
// shown with its size and sha256, which are the module's the WasmPlugin pins.
func showECDS(ctx context.Context, socket, node string, names []string) error {
	s, err := ecdsclient.Subscribe(ctx, socket, node, names)
	if err != nil {
		return err
	}
	defer s.Close()
	resp, err := s.Recv()
	if err != nil {
		return fmt.Errorf("receiving ECDS from %s: %w", socket, err)
	}
	missing := slices.Clone(names)
	for _, r := range resp.GetResources() {
		name, what, err := ecdsclient.Loads(r)
		if err != nil {
			return err
		}
		missing = slices.DeleteFunc(missing, func(n string) bool { return n == name })
		if path, ok := strings.CutPrefix(what, "file:"); ok {
			b, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("%s: reading the module Envoy loads: %w", name, err)
			}
			what = fmt.Sprintf("the Wasm module file %s (%d bytes, sha256 %x)", path, len(b), sha256.Sum256(b))
		} else if d, ok := fallbacks[what]; ok {
			what = d
		}
		fmt.Printf("%s: Envoy loads %s\n", name, what)
	}
	if len(missing) > 0 {
		return fmt.Errorf("no ECDS resource named %s in the answer", strings.Join(missing, ", "))
	}
	return nil
}

var fallbacks = map[string]string{
	"allow":  "the allow-all RBAC filter (the module could not be fetched; FAIL_OPEN)",
	"deny":   "the deny-all RBAC filter (the module could not be fetched; FAIL_CLOSE)",
	"remote": "remote code: not converted, Envoy would reject it",
}
