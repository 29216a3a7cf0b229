package bootstrap

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1 "istio.io/api/mesh/v1alpha1"

	"github.com/agentd/agentd/internal/testing/configcheck"
	"github.com/agentd/agentd/test/compat/jsondiff"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// sidecarEnv is what Istio's injection template puts into the istio-proxy container.
var sidecarEnv = []string{
	"POD_NAME=reviews-v1-6f8d675df4-ml8js",
	"POD_NAMESPACE=bookinfo",
	"INSTANCE_IP=10.244.1.17",
	"SERVICE_ACCOUNT=bookinfo-reviews",
	`PROXY_CONFIG={"holdApplicationUntilProxyStarts":true}`,
	`ISTIO_META_POD_PORTS=[{"containerPort":9080,"protocol":"TCP"}]`,
	"ISTIO_META_APP_CONTAINERS=reviews",
	"ISTIO_META_CLUSTER_ID=Kubernetes",
	"ISTIO_META_NODE_NAME=node-1",
	"ISTIO_META_INTERCEPTION_MODE=REDIRECT",
	"ISTIO_META_WORKLOAD_NAME=reviews-v1",
	"ISTIO_META_OWNER=kubernetes://apis/apps/v1/namespaces/bookinfo/deployments/reviews-v1",
	"ISTIO_META_MESH_ID=cluster.local",
	`ISTIO_METAJSON_LABELS={"app":"reviews","version":"v1"}`,
	"TRUST_DOMAIN=cluster.local",
}

const sidecarLabels = `app="reviews"
pod-template-hash="6f8d675df4"
security.istio.io/tlsMode="istio"
service.istio.io/canonical-name="reviews"
service.istio.io/canonical-revision="v1"
topology.istio.io/locality="us-east1.us-east1-b"
version="v1"`

const sidecarAnnotations = `kubectl.kubernetes.io/default-container="reviews"
proxy.istio.io/config="{\"terminationDrainDuration\": \"20s\", \"proxyStatsMatcher\": {\"inclusionPrefixes\": [\"http.{pod_ip}_\"]}}"
sidecar.istio.io/extraStatTags="destination_port,request_host"
sidecar.istio.io/statsHistogramBuckets="{\"istiocustom\":[1,5,10,50,100,500,1000,5000,10000]}"
sidecar.istio.io/status="{\"initContainers\":[\"istio-init\"],\"containers\":[\"istio-proxy\"]}"`

// routerMesh is a gateway's mesh config file (the istio ConfigMap's "mesh" key).
const routerMesh = `
accessLogFile: /dev/stdout
defaultConfig:
  discoveryAddress: istiod.istio-system.svc:15012
  tracing:
    zipkin:
      address: zipkin.istio-system:9411
  statsdUdpAddress: 10.96.0.20:8125
  proxyMetadata:
    ISTIO_META_DNS_CAPTURE: "true"
  runtimeValues:
    re2.max_program_size.error_level: ""
    envoy.reloadable_features.my_feature: "true"
  concurrency: 2
enablePrometheusMerge: true
`

var routerEnv = []string{
	"POD_NAME=istio-ingressgateway-5c7d8b6f9-abcde",
	"POD_NAMESPACE=istio-system",
	"INSTANCE_IP=10.244.2.5",
	"SERVICE_ACCOUNT=istio-ingressgateway-service-account",
	"ISTIO_META_WORKLOAD_NAME=istio-ingressgateway",
	"ISTIO_META_ROUTER_MODE=sni-dnat",
	"ISTIO_META_CLUSTER_ID=Kubernetes",
}

// vmProxyConfig is what istio-start.sh exports for a VM.
const vmProxyConfig = `
serviceCluster: rawvm
controlPlaneAuthPolicy: MUTUAL_TLS
discoveryAddress: istiod.istio-system.svc:15012
`

var vmEnv = []string{
	"POD_NAME=vm-1",
	"POD_NAMESPACE=vm-ns",
	"INSTANCE_IP=fd00:10::5",
	"ISTIO_META_NETWORK=vm-network",
	"ISTIO_META_AUTO_REGISTER_GROUP=vm-group",
	"ISTIO_META_CLUSTER_ID=Kubernetes",
}

func env(list []string, key string) string {
	for _, kv := range list {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

type goldenCase struct {
	name       string
	typ        ProxyType
	env        []string
	mesh       string
	proxyEnv   string
	labels     string
	annos      string
	ips        []string
	exitOnZero bool
	delta      bool
	dualStack  bool
	modify     func(*Config) // settings the environment above does not reach
}

var goldenCases = []goldenCase{
	{name: "sidecar", typ: Sidecar, env: sidecarEnv, labels: sidecarLabels, annos: sidecarAnnotations,
		ips: []string{"10.244.1.17"}, delta: true, exitOnZero: true},
	{name: "router", typ: Router, env: routerEnv, mesh: routerMesh, ips: []string{"10.244.2.5", "fd00::5"}, delta: true},
	{name: "vm", typ: Sidecar, env: vmEnv, proxyEnv: vmProxyConfig, ips: []string{"fd00:10::5"}, delta: false},
	// Datadog tracing, metadata discovery, ports and sockets of agentd's own choosing, the
	// Prometheus listener on localhost only, and a connection limit from the ProxyConfig.
	{name: "datadog", typ: Sidecar, env: sidecarEnv, labels: sidecarLabels, ips: []string{"10.244.1.17"}, delta: true,
		proxyEnv: datadogProxyConfig, modify: func(c *Config) {
			c.MetadataDiscovery = true
			c.EnvoyStatusPort, c.EnvoyPrometheusPort = 16021, 16090
			c.WorkloadIdentitySocketFile = "agentd.sock"
			c.StsPort, c.DNSProxyAddr = 15463, "127.0.0.1:15053"
		}},
	// Metrics and access log services (keepalive, metrics sink), compression off by the
	// ProxyConfig, the limit from proxyMetadata, the outlier log.
	{name: "remote", typ: Router, env: routerEnv, proxyEnv: remoteProxyConfig, ips: []string{"10.244.2.5"}, delta: false,
		modify: func(c *Config) { c.OutlierLogPath = "/var/log/outlier.log" }},
	// The stats matcher of the ProxyConfig, overridden in part by annotations, extra tags from
	// both, the flush and eviction intervals, and compression off by annotation.
	{name: "stats", typ: Sidecar, env: sidecarEnv, proxyEnv: statsProxyConfig, annos: statsAnnotations,
		ips: []string{"10.244.1.17", "10.244.1.18"}, delta: true},
	// Dual stack, IPv4 first and IPv6 first: both wildcards, ALL lookups for the DNS clusters.
	{name: "dualstack4", typ: Router, env: routerEnv, mesh: routerMesh, ips: []string{"10.244.2.5", "fd00::5"}, delta: true, dualStack: true},
	// TLS to the tracer (the workload's certificate), the metrics service (a CA file, SANs)
	// and the access log service (a client certificate from files), a $(HOST_IP) tracer.
	{name: "tls", typ: Sidecar, env: append(slices.Clone(sidecarEnv), "HOST_IP=10.0.0.7"), ips: []string{"10.244.1.17"}, delta: true,
		proxyEnv: tlsProxyConfig},
	// Lightstep tracing (a gRPC cluster, the token file) with TLS to the collector from files.
	{name: "lightstep", typ: Sidecar, env: sidecarEnv, labels: sidecarLabels, ips: []string{"10.244.1.17"}, delta: true,
		proxyEnv: lightstepProxyConfig},
	{name: "dualstack6", typ: Sidecar, env: vmEnv, proxyEnv: datadogProxyConfig, ips: []string{"fd00:10::5", "10.0.0.5"}, dualStack: true},
}

const datadogProxyConfig = `
tracing:
  datadog:
    address: datadog-agent.monitoring:8126
proxyMetadata:
  METRICS_LOCALHOST_ACCESS_ONLY: "true"
connectionSettings:
  globalDownstreamConnectionLimit: 5000
runtimeValues:
  overload.global_downstream_max_connections: "100"
  envoy.reloadable_features.http_reject_path_with_fragment: ""
  envoy.custom: "42"
`

const tlsProxyConfig = `
tracing:
  zipkin:
    address: $(HOST_IP):9411
  tlsSettings:
    mode: ISTIO_MUTUAL
envoyMetricsService:
  address: metrics.monitoring:9000
  tlsSettings:
    mode: SIMPLE
    caCertificates: /etc/metrics/ca.pem
    subjectAltNames: [metrics.monitoring.svc]
    sni: metrics.example
envoyAccessLogService:
  address: als.monitoring:9001
  tlsSettings:
    mode: MUTUAL
    clientCertificate: /etc/als/cert.pem
    privateKey: /etc/als/key.pem
    caCertificates: /etc/als/ca.pem
`

const lightstepProxyConfig = `
tracing:
  lightstep:
    address: lightstep-satellite.monitoring:8080
    accessToken: abcdefg1234567
  tlsSettings:
    mode: SIMPLE
    caCertificates: /etc/lightstep/ca.pem
    subjectAltNames: [lightstep-satellite.monitoring.svc]
`

const remoteProxyConfig = `
envoyMetricsService:
  address: metrics.monitoring:9000
  tcpKeepalive:
    probes: 3
    time: 60s
    interval: 10s
envoyAccessLogService:
  address: als.monitoring:9001
statsCompression: false
proxyMetadata:
  ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS: "20000"
statsdUdpAddress: "[fd00::20]:8125"
`

const statsProxyConfig = `
proxyStatsMatcher:
  inclusionPrefixes: ["upstream_cx", "http.{pod_ip}_8080"]
  inclusionSuffixes: ["rq_total"]
  inclusionRegexps: ["listener\\..*\\.downstream_cx_total"]
extraStatTags: ["source_version"]
`

const statsAnnotations = `sidecar.istio.io/statsInclusionSuffixes="upstream_rq_time,{pod_ip}_suffix"
sidecar.istio.io/statsInclusionRegexps="cluster\\..*\\.upstream_rq"
sidecar.istio.io/extraStatTags="request_protocol, source_version"
sidecar.istio.io/statsFlushInterval="2s"
sidecar.istio.io/statsEvictionInterval="30s"
sidecar.istio.io/statsCompression="false"
sidecar.istio.io/statsHistogramBuckets="{\"cluster\":[0.5,1,5],\"istiocustom\":[1,10]}"`

func (g goldenCase) config(t *testing.T) *Config {
	t.Helper()
	annos, err := ParseDownwardAPI(g.annos)
	if err != nil {
		t.Fatal(err)
	}
	labels, err := ParseDownwardAPI(g.labels)
	if err != nil {
		t.Fatal(err)
	}
	proxyEnv := g.proxyEnv
	if proxyEnv == "" {
		proxyEnv = env(g.env, "PROXY_CONFIG")
	}
	pc, err := MergeProxyConfig(ProxyConfigSources{MeshConfig: g.mesh, Env: proxyEnv, Annotations: annos, ServiceCluster: "istio-proxy"})
	if err != nil {
		t.Fatal(err)
	}
	c := &Config{
		Type:                        g.typ,
		PodName:                     env(g.env, "POD_NAME"),
		PodNamespace:                env(g.env, "POD_NAMESPACE"),
		ServiceAccount:              env(g.env, "SERVICE_ACCOUNT"),
		IPs:                         g.ips,
		ProxyConfig:                 pc,
		Labels:                      labels,
		Annotations:                 annos,
		Env:                         g.env,
		IstioVersion:                "1.32.0",
		DeltaXDS:                    g.delta,
		ExitOnZeroActiveConnections: g.exitOnZero,
		PilotSAN:                    []string{"istiod.istio-system.svc"},
		DualStack:                   g.dualStack,
	}
	if g.modify != nil {
		g.modify(c)
	}
	return c
}

// TestBootstrapGolden: the bootstrap of every test configuration is, as a message, the one
// in testdata/bootstrap/<name>.json (written by the typed generator agentd had before it
// built the JSON itself), and it decodes strictly and passes full validation.
func TestBootstrapGolden(t *testing.T) {
	for _, g := range goldenCases {
		t.Run(g.name, func(t *testing.T) {
			c := g.config(t)
			got := writeBootstrap(t, c)
			golden := filepath.Join("testdata", "bootstrap", g.name+".json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			// What Envoy reads is what decodes strictly and passes full validation, Any
			// payloads included.
			b, err := configcheck.ParseBootstrap(got)
			if err != nil {
				t.Fatalf("ParseBootstrap(generated) = %v", err)
			}
			wb := &bootstrapv3.Bootstrap{}
			if err := protojson.Unmarshal(want, wb); err != nil {
				t.Fatalf("decode %s: %v", golden, err)
			}
			if !proto.Equal(b, wb) {
				t.Errorf("bootstrap differs from %s (run with -update after checking the change):\n%s", golden, messageDiff(t, b, wb))
			}
			if b.GetNode().GetId() != c.NodeID() {
				t.Errorf("node id = %q, want %q", b.GetNode().GetId(), c.NodeID())
			}
		})
	}
}

// writeBootstrap is what Write writes for c.
func writeBootstrap(t *testing.T, c *Config) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), File)
	if err := Write(c, path); err != nil {
		t.Fatalf("Write: %v", err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// parseBootstrap generates c's bootstrap and decodes it as Envoy would: strictly, and
// passing full validation.
func parseBootstrap(t testing.TB, c *Config) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := Build(c)
	if err != nil {
		t.Fatalf("Bootstrap: %v", err)
	}
	b, err := configcheck.ParseBootstrap(data)
	if err != nil {
		t.Fatalf("ParseBootstrap(generated) = %v", err)
	}
	return b
}

// messageDiff is the first differing line of two messages in one canonical JSON layout.
func messageDiff(t *testing.T, got, want proto.Message) string {
	t.Helper()
	canonical := func(m proto.Message) []byte {
		raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	return firstDiff(canonical(got), canonical(want))
}

func TestBootstrapContents(t *testing.T) {
	c := goldenCases[0].config(t)
	b := parseBootstrap(t, c)
	md := b.GetNode().GetMetadata().GetFields()
	for key, want := range map[string]string{
		"CLUSTER_ID":                      "Kubernetes",
		"NAME":                            "reviews-v1-6f8d675df4-ml8js",
		"NAMESPACE":                       "bookinfo",
		"INSTANCE_IPS":                    "10.244.1.17",
		"app":                             "reviews", // Istio merges ISTIO_METAJSON_* objects at the top level
		"EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true",
	} {
		if got := md[key].GetStringValue(); got != want {
			t.Errorf("metadata %s = %q, want %q", key, got, want)
		}
	}
	labels := md["LABELS"].GetStructValue().GetFields()
	if _, ok := labels["pod-template-hash"]; ok {
		t.Error("LABELS has pod-template-hash")
	}
	if got := labels["istio-locality"].GetStringValue(); got != "us-east1/us-east1-b" { // Istio writes it there
		t.Errorf("locality label = %q", got)
	}
	if l := b.GetNode().GetLocality(); l.GetRegion() != "us-east1" || l.GetZone() != "us-east1-b" {
		t.Errorf("locality = %v", l)
	}
	if got := b.GetNode().GetCluster(); got != "reviews.bookinfo" {
		t.Errorf("cluster = %q, want reviews.bookinfo", got)
	}
	if got := md["PROXY_CONFIG"].GetStructValue().GetFields()["terminationDrainDuration"].GetStringValue(); got != "20s" {
		t.Errorf("PROXY_CONFIG.terminationDrainDuration = %q (the annotation should win)", got)
	}
	if got := b.GetDynamicResources().GetAdsConfig().GetApiType(); got != corev3.ApiConfigSource_DELTA_GRPC {
		t.Errorf("ads api type = %v", got)
	}
	paths := map[string]string{}
	for _, cl := range b.GetStaticResources().GetClusters() {
		if p := cl.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath(); p != "" {
			paths[cl.GetName()] = p
		}
	}
	if paths["xds-grpc"] != "./etc/istio/proxy/XDS" || paths["sds-grpc"] != DefaultSDSSocket {
		t.Errorf("unix socket clusters = %v", paths)
	}
	var suffixes, prefixes []string
	for _, p := range b.GetStatsConfig().GetStatsMatcher().GetInclusionList().GetPatterns() {
		if s := p.GetSuffix(); s != "" {
			suffixes = append(suffixes, s)
		}
		if s := p.GetPrefix(); s != "" {
			prefixes = append(prefixes, s)
		}
	}
	if !contains(suffixes, "downstream_cx_active") {
		t.Errorf("suffixes %v lack downstream_cx_active with EXIT_ON_ZERO_ACTIVE_CONNECTIONS", suffixes)
	}
	if !contains(prefixes, "http.10.244.1.17_") || !contains(prefixes, "cluster_manager") {
		t.Errorf("prefixes %v lack the {pod_ip} substitution or the required ones", prefixes)
	}
	ports := map[uint32]string{}
	for _, l := range b.GetStaticResources().GetListeners() {
		sa := l.GetAddress().GetSocketAddress()
		ports[sa.GetPortValue()] = sa.GetAddress()
	}
	if ports[15090] != "0.0.0.0" || ports[15021] != "0.0.0.0" {
		t.Errorf("listeners = %v, want 15090 and 15021 on 0.0.0.0", ports)
	}
	if got := b.GetAdmin().GetAddress().GetSocketAddress(); got.GetAddress() != "127.0.0.1" || got.GetPortValue() != 15000 {
		t.Errorf("admin = %v", got)
	}
}

func contains(l []string, s string) bool {
	for _, v := range l {
		if v == s {
			return true
		}
	}
	return false
}

func TestBrokenInputFails(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{"missing pod name", func(c *Config) { c.PodName = "" }, "POD_NAME is not set"},
		{"missing namespace", func(c *Config) { c.PodNamespace = "" }, "POD_NAMESPACE is not set"},
		{"bad ip", func(c *Config) { c.IPs = []string{"10.0.0.300"} }, `proxy IP "10.0.0.300"`},
		{"unsupported type", func(c *Config) { c.Type = "waypoint" }, "not supported by agentd"},
		{"admin port out of range", func(c *Config) { c.ProxyConfig.ProxyAdminPort = 70000 }, "proxyAdminPort 70000"},
		{"metadata that Istio cannot read", func(c *Config) { c.Env = append(c.Env, "ISTIO_META_DNS_CAPTURE=yes") }, "DNS_CAPTURE=yes: not a boolean"},
		{"pod ports that are not a list", func(c *Config) { c.Env = append(c.Env, "ISTIO_META_POD_PORTS=8080") }, "POD_PORTS=8080"},
		{"socket file that is a path", func(c *Config) { c.WorkloadIdentitySocketFile = "../x" }, "must be a file name"},
		{"zero connection limit", func(c *Config) {
			c.ProxyConfig.ProxyMetadata = map[string]string{"ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": "0"}
		}, "GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"},
		// What Envoy's validation rejects, checked by agentd before it writes the bootstrap.
		{"status port out of range", func(c *Config) { c.EnvoyStatusPort = 70000 }, "ENVOY_STATUS_PORT 70000"},
		{"negative prometheus port", func(c *Config) { c.EnvoyPrometheusPort = -1 }, "ENVOY_PROMETHEUS_PORT -1"},
		{"flush interval too short", func(c *Config) { c.Annotations["sidecar.istio.io/statsFlushInterval"] = "0s" }, "statsFlushInterval"},
		{"flush interval too long", func(c *Config) { c.Annotations["sidecar.istio.io/statsFlushInterval"] = "5m" }, "less than 5m0s"},
		{"negative histogram bound", func(c *Config) {
			c.Annotations["sidecar.istio.io/statsHistogramBuckets"] = `{"istiocustom":[1,-5]}`
		}, "bound -5: must be positive"},
		{"repeated histogram bound", func(c *Config) {
			c.Annotations["sidecar.istio.io/statsHistogramBuckets"] = `{"istiocustom":[1,5,1]}`
		}, "bound 1: must be positive and not repeated"},
		{"empty histogram prefix", func(c *Config) { c.Annotations["sidecar.istio.io/statsHistogramBuckets"] = `{"":[1]}` }, "empty prefix"},
		{"empty inclusion entry in the annotation", func(c *Config) {
			c.Annotations["sidecar.istio.io/statsInclusionPrefixes"] = "upstream_cx,"
		}, "statsInclusionPrefixes"},
		{"empty inclusion entry in the ProxyConfig", func(c *Config) {
			c.ProxyConfig.ProxyStatsMatcher = &meshv1.ProxyConfig_ProxyStatsMatcher{InclusionRegexps: []string{""}}
		}, "proxyStatsMatcher.inclusionRegexps: empty entry"},
		{"extra stat tag too long", func(c *Config) {
			c.Annotations["sidecar.istio.io/extraStatTags"] = strings.Repeat("t", 1020)
		}, "longer than Envoy's tag expressions allow"},
		{"socket file not UTF-8", func(c *Config) { c.WorkloadIdentitySocketFile = "\xff.sock" }, "UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := goldenCases[0].config(t)
			tt.modify(c)
			path := filepath.Join(t.TempDir(), File)
			err := Write(c, path)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Write = %v, want an error with %q", err, tt.want)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("a bootstrap was written despite the error")
			}
		})
	}
}

// TestIstioWarnsAndGoesOn: input Istio's agent warns about and ignores is warned about and
// ignored: the bootstrap is the one without it.
func TestIstioWarnsAndGoesOn(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
	}{
		{"bad ISTIO_METAJSON", func(c *Config) { c.Env = append(c.Env, `ISTIO_METAJSON_ANNOTATIONS={"a":`) }},
		{"ISTIO_METAJSON not an object", func(c *Config) { c.Env = append(c.Env, `ISTIO_METAJSON_X=[1]`) }},
		{"bad histogram annotation", func(c *Config) {
			if c.Warn != nil { // the bad one; the bootstrap is the one without the annotation
				c.Annotations["sidecar.istio.io/statsHistogramBuckets"] = "{"
			} else {
				delete(c.Annotations, "sidecar.istio.io/statsHistogramBuckets")
			}
		}},
		{"bad flush interval", func(c *Config) { c.Annotations["sidecar.istio.io/statsFlushInterval"] = "soon" }},
		{"eviction not a multiple of flush", func(c *Config) { c.Annotations["sidecar.istio.io/statsEvictionInterval"] = "7s" }},
		{"metadata discovery without delta", func(c *Config) { c.MetadataDiscovery, c.DeltaXDS = true, false }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := goldenCases[0].config(t)
			base.DeltaXDS = false
			if tt.name == "bad histogram annotation" {
				tt.modify(base)
			}
			want, err := Build(base)
			if err != nil {
				t.Fatal(err)
			}
			c := goldenCases[0].config(t)
			c.DeltaXDS = false
			var warnings []string
			c.Warn = func(msg string, _ ...any) { warnings = append(warnings, msg) }
			tt.modify(c)
			got, err := Build(c)
			if err != nil {
				t.Fatalf("Build = %v, want a warning and the bootstrap without the bad input", err)
			}
			if len(warnings) == 0 {
				t.Error("no warning")
			}
			var g, w map[string]any
			json.Unmarshal(got, &g)
			json.Unmarshal(want, &w)
			for _, doc := range []map[string]any{g, w} { // where the bad input is kept as given
				delete(doc["node"].(map[string]any)["metadata"].(map[string]any), "ANNOTATIONS")
				delete(doc["node"].(map[string]any)["metadata"].(map[string]any), "METADATA_DISCOVERY")
			}
			if diff := jsondiff.Diff("", g, w); len(diff) > 0 {
				t.Errorf("bootstrap differs from the one without the bad input: %v", diff)
			}
		})
	}
}

func firstDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n got: " + gl + "\nwant: " + wl
		}
	}
	return ""
}
