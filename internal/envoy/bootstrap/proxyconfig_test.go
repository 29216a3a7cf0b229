package bootstrap

import (
	"strings"
	"testing"
	"time"

	meshv1 "istio.io/api/mesh/v1alpha1"
)

func TestMergeProxyConfigOrder(t *testing.T) {
	mesh := `
defaultConfig:
  terminationDrainDuration: 10s
  drainDuration: 30s
  extraStatTags: [a, b]
  proxyMetadata: {FROM_MESH: "1", SHARED: mesh}
  tracing: {zipkin: {address: "zipkin.mesh:9411"}}
`
	envCfg := `{"terminationDrainDuration": "15s", "extraStatTags": ["c"], "proxyMetadata": {"SHARED": "env"}, "unknownFutureField": 1}`
	annos := map[string]string{
		"proxy.istio.io/config":             "terminationDrainDuration: 20s\nconcurrency: 3\n",
		"sidecar.istio.io/discoveryAddress": "istiod.other:15012",
		"status.sidecar.istio.io/port":      "15999",
	}
	pc, err := MergeProxyConfig(ProxyConfigSources{MeshConfig: mesh, Env: envCfg, Annotations: annos, ServiceCluster: "svc", CPULimit: 8})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"terminationDrainDuration (annotation wins)", pc.TerminationDrainDuration.AsDuration(), 20 * time.Second},
		{"drainDuration (mesh file over default)", pc.DrainDuration.AsDuration(), 30 * time.Second},
		{"extraStatTags (lists replaced)", strings.Join(pc.ExtraStatTags, ","), "c"},
		{"proxyMetadata FROM_MESH (maps merged)", pc.ProxyMetadata["FROM_MESH"], "1"},
		{"proxyMetadata SHARED", pc.ProxyMetadata["SHARED"], "env"},
		{"tracing kept from mesh", pc.GetTracing().GetZipkin().GetAddress(), "zipkin.mesh:9411"},
		{"concurrency (annotation over ISTIO_CPU_LIMIT)", pc.GetConcurrency().GetValue(), int32(3)},
		{"discoveryAddress annotation", pc.DiscoveryAddress, "istiod.other:15012"},
		{"statusPort annotation", pc.StatusPort, int32(15999)},
		{"serviceCluster default (the flag fills only an empty one)", pc.GetServiceCluster(), "istio-proxy"},
		{"default admin port", pc.ProxyAdminPort, int32(15000)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestMergeProxyConfigServiceClusterFlag(t *testing.T) {
	pc, err := MergeProxyConfig(ProxyConfigSources{Env: `serviceCluster: ""`, ServiceCluster: "rawvm"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pc.GetServiceCluster(); got != "rawvm" {
		t.Errorf("serviceCluster = %q, want the --serviceCluster value rawvm", got)
	}
}

func TestMergeProxyConfigConcurrency(t *testing.T) {
	tests := []struct {
		name      string
		env       string
		flag, cpu int
		want      int32 // 0: unset
	}{
		{"unset", "", 0, 0, 0},
		{"from ISTIO_CPU_LIMIT", "", 0, 4, 4},
		{"ProxyConfig over ISTIO_CPU_LIMIT", "concurrency: 2", 0, 4, 2},
		{"flag over everything", "concurrency: 2", 6, 4, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pc, err := MergeProxyConfig(ProxyConfigSources{Env: tt.env, Concurrency: tt.flag, CPULimit: tt.cpu})
			if err != nil {
				t.Fatal(err)
			}
			if got := pc.GetConcurrency().GetValue(); got != tt.want {
				t.Errorf("concurrency = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestMergeProxyConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		src  ProxyConfigSources
		want string
	}{
		{"bad yaml in PROXY_CONFIG", ProxyConfigSources{Env: "a: [1"}, "PROXY_CONFIG: parse YAML"},
		{"wrong type in PROXY_CONFIG", ProxyConfigSources{Env: `{"proxyAdminPort": "x"}`}, "PROXY_CONFIG: parse ProxyConfig"},
		{"bad mesh file", ProxyConfigSources{MeshConfig: "defaultConfig: {drainDuration: forever}"}, "mesh config file"},
		{"bad annotation", ProxyConfigSources{Annotations: map[string]string{"proxy.istio.io/config": "{"}}, "annotation proxy.istio.io/config"},
		{"bad discovery address", ProxyConfigSources{Env: "discoveryAddress: istiod"}, "discoveryAddress"},
		{"admin port clash", ProxyConfigSources{Env: "proxyAdminPort: 15020"}, "both 15020"},
		{"negative drain", ProxyConfigSources{Env: "terminationDrainDuration: -5s"}, "terminationDrainDuration"},
		{"lightstep without a token", ProxyConfigSources{Env: "tracing: {lightstep: {address: ls:8080}}"}, "tracing.lightstep.accessToken is required"},
		{"lightstep without an address", ProxyConfigSources{Env: "tracing: {lightstep: {accessToken: t}}"}, "tracing.lightstep.address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := MergeProxyConfig(tt.src)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("MergeProxyConfig = %v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestParseDownwardAPI(t *testing.T) {
	got, err := ParseDownwardAPI("a=\"1\"\nb=\"x=\\\"y\\\"\"\n\nnoequals\n")
	if err != nil {
		t.Fatal(err)
	}
	if got["a"] != "1" || got["b"] != `x="y"` || len(got) != 2 {
		t.Errorf("ParseDownwardAPI = %v", got)
	}
	if _, err := ParseDownwardAPI("a=unquoted"); err == nil {
		t.Error("ParseDownwardAPI accepted an unquoted value")
	}
}

func TestServiceCluster(t *testing.T) {
	canon := &meshv1.ProxyConfig{ClusterName: &meshv1.ProxyConfig_TracingServiceName_{TracingServiceName: meshv1.ProxyConfig_CANONICAL_NAME_AND_NAMESPACE}}
	tests := []struct {
		name     string
		pc       *meshv1.ProxyConfig
		labels   map[string]string
		workload string
		want     string
	}{
		{"explicit", &meshv1.ProxyConfig{ClusterName: &meshv1.ProxyConfig_ServiceCluster{ServiceCluster: "rawvm"}}, nil, "", "rawvm"},
		{"app label", DefaultProxyConfig(), map[string]string{"app": "reviews"}, "w", "reviews.ns"},
		{"workload", DefaultProxyConfig(), nil, "w", "w.ns"},
		{"namespace only", DefaultProxyConfig(), nil, "", "istio-proxy.ns"},
		{"canonical", canon, map[string]string{"service.istio.io/canonical-name": "c"}, "w", "c.ns"},
	}
	for _, tt := range tests {
		if got := serviceCluster(tt.pc, tt.labels, "ns", tt.workload); got != tt.want {
			t.Errorf("%s: serviceCluster = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestMergeProxyConfigZeroValues(t *testing.T) {
	pc, err := MergeProxyConfig(ProxyConfigSources{
		MeshConfig: "defaultConfig: {statNameLength: 100, proxyMetadata: {A: a}}",
		Env:        `{"controlPlaneAuthPolicy": "NONE", "statNameLength": 0}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	if pc.ControlPlaneAuthPolicy != meshv1.AuthenticationPolicy_NONE {
		t.Errorf("controlPlaneAuthPolicy = %v, want NONE (a zero value that overrides the default)", pc.ControlPlaneAuthPolicy)
	}
	if pc.StatNameLength != 0 || pc.ProxyMetadata["A"] != "a" {
		t.Errorf("statNameLength = %d, proxyMetadata = %v", pc.StatNameLength, pc.ProxyMetadata)
	}
}

// TestMergeProxyConfigIstioRules: each source replaces the top-level fields it gives, whole (a
// nested message, a map, a list); a field given as null is left as it was; only proxyMetadata
// merges key by key, and proxyHeaders keeps the earlier parts the later source leaves unset;
// a status port annotation that does not parse is warned about and becomes 0 (no status
// server), as in Istio's pilot-agent.
func TestMergeProxyConfigIstioRules(t *testing.T) {
	tests := []struct {
		name       string
		src        ProxyConfigSources
		check      func(pc *meshv1.ProxyConfig) bool
		wantWarned bool
	}{
		{"a nested message is replaced", ProxyConfigSources{
			MeshConfig:  "defaultConfig: {tracing: {zipkin: {address: z:9411}, sampling: 1}}",
			Annotations: map[string]string{"proxy.istio.io/config": `{"tracing":{"sampling":50}}`},
		}, func(pc *meshv1.ProxyConfig) bool {
			return pc.GetTracing().GetSampling() == 50 && pc.GetTracing().GetZipkin() == nil
		}, false},
		{"a map other than proxyMetadata is replaced", ProxyConfigSources{
			MeshConfig: "defaultConfig: {runtimeValues: {a: '1'}}", Env: `{"runtimeValues":{"b":"2"}}`,
		}, func(pc *meshv1.ProxyConfig) bool {
			return len(pc.GetRuntimeValues()) == 1 && pc.GetRuntimeValues()["b"] == "2"
		}, false},
		{"a sub-message's lists are not merged", ProxyConfigSources{
			MeshConfig:  "defaultConfig: {proxyStatsMatcher: {inclusionPrefixes: [a]}}",
			Annotations: map[string]string{"proxy.istio.io/config": `{"proxyStatsMatcher":{"inclusionRegexps":["b.*"]}}`},
		}, func(pc *meshv1.ProxyConfig) bool {
			m := pc.GetProxyStatsMatcher()
			return len(m.GetInclusionPrefixes()) == 0 && len(m.GetInclusionRegexps()) == 1
		}, false},
		{"null leaves a field as it was", ProxyConfigSources{
			Env: "concurrency: 2", Annotations: map[string]string{"proxy.istio.io/config": "concurrency: null"},
		}, func(pc *meshv1.ProxyConfig) bool { return pc.GetConcurrency().GetValue() == 2 }, false},
		{"proxyMetadata merges", ProxyConfigSources{
			MeshConfig: "defaultConfig: {proxyMetadata: {A: '1', B: '1'}}", Env: `{"proxyMetadata":{"B":"2"}}`,
		}, func(pc *meshv1.ProxyConfig) bool {
			return pc.ProxyMetadata["A"] == "1" && pc.ProxyMetadata["B"] == "2"
		}, false},
		{"proxyHeaders keeps the earlier parts", ProxyConfigSources{
			MeshConfig:  "defaultConfig: {proxyHeaders: {server: {disabled: true}}}",
			Annotations: map[string]string{"proxy.istio.io/config": `{"proxyHeaders":{"requestId":{"disabled":true}}}`},
		}, func(pc *meshv1.ProxyConfig) bool {
			h := pc.GetProxyHeaders()
			return h.GetServer().GetDisabled().GetValue() && h.GetRequestId().GetDisabled().GetValue()
		}, false},
		{"a bad status port annotation is no status server", ProxyConfigSources{
			Annotations: map[string]string{"status.sidecar.istio.io/port": "abc"},
		}, func(pc *meshv1.ProxyConfig) bool { return pc.GetStatusPort() == 0 }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			warned := false
			tt.src.Warn = func(string, ...any) { warned = true }
			pc, err := MergeProxyConfig(tt.src)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(pc) {
				t.Errorf("MergeProxyConfig = %v, not Istio's", pc)
			}
			if warned != tt.wantWarned {
				t.Errorf("warned: %v, want %v", warned, tt.wantWarned)
			}
		})
	}
}
