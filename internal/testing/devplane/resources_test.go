package devplane

import (
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
)

const testFile = `services:
- hostname: Reviews.default.svc.cluster.local.
  namespace: default
  addresses: [10.96.0.12]
  ports: [{name: grpc, port: 9080, protocol: grpc}, {name: tcp, port: 9081}]
  endpoints: [{address: 127.0.0.1, port: 50051, ports: {tcp: 50052}}, {address: "::1"}]
- hostname: api.example.com
  registry: External
  addresses: [240.240.0.1]
  ports: [{port: 443, protocol: TCP}]
`

func TestParseServices(t *testing.T) {
	services, err := ParseServices([]byte(testFile))
	if err != nil {
		t.Fatal(err)
	}
	s := services[0]
	if s.Hostname != "reviews.default.svc.cluster.local" || s.Registry != "Kubernetes" || s.Ports[0].Protocol != "GRPC" || s.Ports[1].Protocol != "TCP" {
		t.Errorf("defaults not applied: %+v", s)
	}
	for _, tc := range []struct {
		ep   Endpoint
		port Port
		want uint32
	}{
		{s.Endpoints[0], s.Ports[0], 50051},
		{s.Endpoints[0], s.Ports[1], 50052},
		{s.Endpoints[1], s.Ports[0], 9080},
	} {
		if got := tc.ep.portFor(tc.port); got != tc.want {
			t.Errorf("portFor(%s, %d) = %d, want %d", tc.ep.Address, tc.port.Port, got, tc.want)
		}
	}
}

func TestParseServicesErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"no hostname", `services: [{ports: [{port: 1}]}]`, "no hostname"},
		{"no ports", `services: [{hostname: a}]`, "no ports"},
		{"bad port", `services: [{hostname: a, ports: [{port: 70000}]}]`, "out of range"},
		{"bad protocol", `services: [{hostname: a, ports: [{port: 1, protocol: UDP}]}]`, "unknown protocol"},
		{"bad vip", `services: [{hostname: a, addresses: [x], ports: [{port: 1}]}]`, "address"},
		{"bad endpoint", `services: [{hostname: a, ports: [{port: 1}], endpoints: [{address: x}]}]`, "endpoint"},
		{"duplicate", `services: [{hostname: a, ports: [{port: 1}]}, {hostname: A, ports: [{port: 1}]}]`, "twice"},
		{"unknown field", `services: [{hostname: a, prots: []}]`, "unknown field"},
		{"wildcard hostname", `services: [{hostname: "*", ports: [{port: 1}]}]`, "not a letter"},
		{"wildcard label", `services: [{hostname: "*.example.com", ports: [{port: 1}]}]`, "not a letter"},
		{"empty label", `services: [{hostname: "a..b", ports: [{port: 1}]}]`, "empty"},
		{"space", `services: [{hostname: "a b", ports: [{port: 1}]}]`, "not a letter"},
		{"hyphen first", `services: [{hostname: "-a.b", ports: [{port: 1}]}]`, "hyphen"},
		{"long label", `services: [{hostname: "` + strings.Repeat("a", 64) + `.b", ports: [{port: 1}]}]`, "63"},
		{"bad namespace", `services: [{hostname: a, namespace: "x.y", ports: [{port: 1}]}]`, "namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseServices([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseServices = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestResourcesValid checks every generated resource against Envoy's validation rules.
func TestResourcesValid(t *testing.T) {
	services, err := ParseServices([]byte(testFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, gen := range []string{generatorGRPC, generatorEnvoy} {
		for typ, rs := range resources(gen, services) {
			for _, r := range rs {
				v, ok := r.(interface{ ValidateAll() error })
				if !ok {
					t.Fatalf("%s: %T has no ValidateAll", typ, r)
				}
				if err := v.ValidateAll(); err != nil {
					t.Errorf("%s %s: %v", gen, typ, err)
				}
			}
		}
	}
}

func TestListenerNames(t *testing.T) {
	services, err := ParseServices([]byte(testFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gen  string
		want []string
	}{
		{generatorGRPC, []string{"reviews.default.svc.cluster.local:9080", "reviews.default.svc.cluster.local:9081", "api.example.com:443"}},
		{generatorEnvoy, []string{"virtualOutbound", "0.0.0.0_9080", "10.96.0.12_9081", "240.240.0.1_443"}},
	} {
		var got []string
		for _, r := range resources(tc.gen, services)[resourcev3.ListenerType] {
			got = append(got, r.(*listenerv3.Listener).Name)
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%s listeners (-want +got):\n%s", tc.gen, d)
		}
	}
}

func TestNameTable(t *testing.T) {
	services, err := ParseServices([]byte(testFile))
	if err != nil {
		t.Fatal(err)
	}
	nt := nameTable(services)
	for host, want := range map[string][3]string{ // registry, shortname, namespace
		"reviews.default.svc.cluster.local": {"Kubernetes", "reviews", "default"},
		"api.example.com":                   {"External", "", ""},
	} {
		info := nt.Table[host]
		if got := [3]string{info.GetRegistry(), info.GetShortname(), info.GetNamespace()}; got != want {
			t.Errorf("name table %s = %v, want %v", host, got, want)
		}
	}
}

func TestWasmPlugins(t *testing.T) {
	f, err := ParseFile([]byte(testFile + `wasmPlugins:
- name: stats
  url: registry.example.com/wasm/stats:v1
  failStrategy: FAIL_OPEN
- name: local
  namespace: ns
  url: file:///opt/plugin.wasm
`))
	if err != nil {
		t.Fatal(err)
	}
	all := withPlugins(resources(generatorEnvoy, f.Services), f.WasmPlugins, "7")
	found := false
	for _, l := range all[resourcev3.ListenerType] {
		if l.(*listenerv3.Listener).GetName() != "0.0.0.0_9080" {
			continue
		}
		found = true
		hcm := &hcmv3.HttpConnectionManager{}
		if err := l.(*listenerv3.Listener).GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, hf := range hcm.GetHttpFilters() {
			if hf.GetConfigDiscovery() != nil {
				names = append(names, hf.GetName())
			}
		}
		if want := []string{wasmResourcePrefix + "default.stats", wasmResourcePrefix + "ns.local"}; !slices.Equal(names, want) {
			t.Errorf("listener 0.0.0.0_9080 fetches %v by ECDS, want %v", names, want)
		}
	}
	if !found {
		t.Error("no listener 0.0.0.0_9080")
	}
	res := all[resourcev3.ExtensionConfigType]
	if len(res) != 2 {
		t.Fatalf("%d ECDS resources, want 2", len(res))
	}
	tests := []struct {
		name, uri, local string
		policy           wasmv3.FailurePolicy
	}{
		{wasmResourcePrefix + "default.stats", "oci://registry.example.com/wasm/stats:v1", "", wasmv3.FailurePolicy_FAIL_OPEN},
		{wasmResourcePrefix + "ns.local", "", "/opt/plugin.wasm", wasmv3.FailurePolicy_FAIL_CLOSED},
	}
	for i, tc := range tests {
		ec := res[i].(*corev3.TypedExtensionConfig)
		w := &httpwasm.Wasm{}
		if err := ec.GetTypedConfig().UnmarshalTo(w); err != nil {
			t.Fatal(err)
		}
		vm := w.GetConfig().GetVmConfig()
		if ec.GetName() != tc.name || vm.GetCode().GetRemote().GetHttpUri().GetUri() != tc.uri ||
			vm.GetCode().GetLocal().GetFilename() != tc.local || w.GetConfig().GetFailurePolicy() != tc.policy ||
			vm.GetEnvironmentVariables().GetKeyValues()["ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"] != "7" {
			t.Errorf("plugin %d = %v, want %+v", i, ec, tc)
		}
	}
	for _, bad := range []string{"- {url: x}", "- {name: a, url: 'ftp://x'}", "- {name: a, url: x, failStrategy: NO}", "- {name: a, url: x, imagePullPolicy: Never}"} {
		if _, err := ParseFile([]byte("wasmPlugins:\n" + bad + "\n")); err == nil {
			t.Errorf("ParseFile(%s) accepted", bad)
		}
	}
}
