package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3" // the Wasm fallback
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	netwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// typeECDS is ECDS: the filters that listeners name with config_discovery (Istio's
// WasmPlugins).
const typeECDS = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"

// ecdsNames are the filters the listeners' HTTP connection managers fetch by ECDS.
func ecdsNames(listeners map[string]*anypb.Any) []string {
	var names []string
	for _, a := range listeners {
		l := &listenerv3.Listener{}
		if a.UnmarshalTo(l) != nil {
			continue
		}
		for _, fc := range append(l.GetFilterChains(), l.GetDefaultFilterChain()) {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					if hf.GetConfigDiscovery() != nil {
						names = append(names, hf.GetName())
					}
				}
			}
		}
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// checkWasm refuses what Envoy cannot load: Wasm code that is not a local file holding a
// Wasm module (an oci:// image Envoy cannot pull; istiod's remote code names cluster "_",
// which does not exist, for the agent to rewrite it).
func checkWasm(m proto.Message) error {
	ec, ok := m.(*corev3.TypedExtensionConfig)
	if !ok {
		return nil
	}
	inner, err := ec.GetTypedConfig().UnmarshalNew()
	if err != nil {
		return fmt.Errorf("extension %s: %w", ec.GetName(), err)
	}
	var pc *wasmv3.PluginConfig
	switch w := inner.(type) {
	case *httpwasm.Wasm:
		pc = w.GetConfig()
	case *netwasm.Wasm:
		pc = w.GetConfig()
	default:
		return nil
	}
	code := pc.GetVmConfig().GetCode()
	if code.GetRemote() != nil {
		return fmt.Errorf("extension %s: remote Wasm code %s", ec.GetName(), code.GetRemote().GetHttpUri().GetUri())
	}
	path := code.GetLocal().GetFilename()
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("extension %s: Wasm module: %w", ec.GetName(), err)
	}
	defer f.Close()
	head := make([]byte, 8)
	if _, err := io.ReadFull(f, head); err != nil || !bytes.HasPrefix(head, []byte("\x00asm")) {
		return fmt.Errorf("extension %s: %s is not a Wasm module", ec.GetName(), path)
	}
	logf("info", "wasm", "extension %s: Wasm module %s", ec.GetName(), path)
	return nil
}
