package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/agentd/agentd/internal/grpcbootstrap"
	"github.com/agentd/agentd/internal/settings"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

func TestXDSProxyConfig(t *testing.T) {
	root := t.TempDir()
	base := &agentv1.XDSProxyConfig{
		// ClusterId unset: Istio's agent sends "" and istiod takes its own cluster.
		DiscoveryAddress: "istiod.istio-system.svc:15012", Headers: map[string]string{},
		Tls: true, RootCert: filepath.Join(root, settings.IstiodRootCert), TokenPath: filepath.Join(root, "var/run/secrets/tokens/istio-token"),
		Wasm: &agentv1.WasmConfig{ // Istio's defaults
			CacheDir: filepath.Join(root, "var/lib/istio/data"), PurgeInterval: durationpb.New(time.Hour), ModuleExpiry: durationpb.New(24 * time.Hour),
			HttpRequestTimeout: durationpb.New(15 * time.Second), HttpRequestMaxRetries: 5, MaxBinarySizeBytes: 256 << 20,
		},
	}
	with := func(f func(c *agentv1.XDSProxyConfig)) *agentv1.XDSProxyConfig {
		c := proto.Clone(base).(*agentv1.XDSProxyConfig)
		f(c)
		return c
	}
	tests := []struct {
		name      string
		discovery string
		env       []string
		files     []string
		want      *agentv1.XDSProxyConfig
	}{
		{"defaults", "", nil, nil, base},
		{"istio settings", "", []string{
			"ISTIO_META_CLUSTER_ID=c1", "XDS_HEADER_X-Tenant=t1", "ISTIOD_SAN=istiod.example", "ISTIO_META_DNS_CAPTURE=true",
			"PROXY_CONFIG_XDS_AGENT=true", "XDS_ROOT_CA=/roots/xds.pem",
		}, nil, with(func(c *agentv1.XDSProxyConfig) {
			c.ClusterId, c.Headers, c.IstiodSan = "c1", map[string]string{"X-Tenant": "t1"}, "istiod.example"
			c.NameTable, c.ProxyConfig, c.RootCert = true, true, "/roots/xds.pem"
		})},
		{"wasm settings", "", []string{
			"ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION=false", "WASM_PURGE_INTERVAL=2h", "WASM_MODULE_EXPIRY=1h",
			"WASM_HTTP_REQUEST_TIMEOUT=3s", "WASM_HTTP_REQUEST_MAX_RETRIES=1", "ISTIO_WASM_MAX_BINARY_SIZE_BYTES=1024",
			"WASM_INSECURE_REGISTRIES=a.example, b.example", "BLOCKED_CIDRS_IN_WASM_FETCH=10.0.0.0/8",
		}, nil, with(func(c *agentv1.XDSProxyConfig) {
			w := c.Wasm
			w.ConversionDisabled, w.PurgeInterval, w.ModuleExpiry = true, durationpb.New(2*time.Hour), durationpb.New(time.Hour)
			w.HttpRequestTimeout, w.HttpRequestMaxRetries, w.MaxBinarySizeBytes = durationpb.New(3*time.Second), 1, 1024
			w.InsecureRegistries, w.BlockedCidrs = []string{"a.example", "b.example"}, []string{"10.0.0.0/8"}
		})},
		{"DNS server on a gateway", "", []string{"ISTIO_META_ENABLE_DNS_SERVER=true"}, nil, with(func(c *agentv1.XDSProxyConfig) { c.NameTable = true })},
		{"PROXY_CONFIG address", "", []string{"PROXY_CONFIG={discoveryAddress: istiod.other:15011}"}, nil,
			with(func(c *agentv1.XDSProxyConfig) { c.DiscoveryAddress = "istiod.other:15011" })},
		{"flag wins", "127.0.0.1:15012", []string{"PROXY_CONFIG={discoveryAddress: istiod.other:15011}"}, nil,
			with(func(c *agentv1.XDSProxyConfig) { c.DiscoveryAddress = "127.0.0.1:15012" })},
		{"istiod's plaintext port", "127.0.0.1:15010", nil, nil,
			with(func(c *agentv1.XDSProxyConfig) { c.DiscoveryAddress, c.Tls, c.RootCert = "127.0.0.1:15010", false, "" })},
		{"system roots", "", []string{"XDS_ROOT_CA=SYSTEM"}, nil, with(func(c *agentv1.XDSProxyConfig) { c.RootCert = "" })},
		{"etc/certs root", "", nil, []string{"etc/certs/root-cert.pem"}, with(func(c *agentv1.XDSProxyConfig) {
			c.RootCert = filepath.Join(root, "etc/certs/root-cert.pem")
		})},
		{"PROV_CERT", "", []string{"PROV_CERT=/prov"}, nil, with(func(c *agentv1.XDSProxyConfig) {
			c.RootCert, c.CertChain, c.Key = "/prov/root-cert.pem", "/prov/cert-chain.pem", "/prov/key.pem"
		})},
		{"file-mounted client cert", "", []string{"FILE_MOUNTED_CERTS=true", "ISTIO_META_TLS_CLIENT_CERT_CHAIN=/m/c.pem",
			"ISTIO_META_TLS_CLIENT_KEY=/m/k.pem", "ISTIO_META_TLS_CLIENT_ROOT_CERT=/m/r.pem"}, nil, with(func(c *agentv1.XDSProxyConfig) {
			c.RootCert, c.CertChain, c.Key = "/m/r.pem", "/m/c.pem", "/m/k.pem"
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, f := range tt.files {
				p := filepath.Join(root, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
				defer os.Remove(p)
			}
			got, err := xdsProxyConfig(resolve(t, settings.Flags{Root: root, DiscoveryAddress: tt.discovery}, tt.env...))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got, protocmp.Transform()); d != "" {
				t.Errorf("xdsProxyConfig (-want +got):\n%s", d)
			}
		})
	}
	if _, err := xdsProxyConfig(resolve(t, settings.Flags{Root: root}, "PILOT_CERT_PROVIDER=none")); err == nil {
		t.Error("xdsProxyConfig with PILOT_CERT_PROVIDER=none and no XDS_ROOT_CA: nil error")
	}
}

// TestGRPCBootstrap: agentd writes the gRPC bootstrap at
// GRPC_XDS_BOOTSTRAP (default etc/istio/proxy/grpc-bootstrap.json) with the XDS socket and
// the node Istio builds.
func TestGRPCBootstrap(t *testing.T) {
	for _, tc := range []struct {
		name, env, path string
	}{
		{"default path", "", "etc/istio/proxy/grpc-bootstrap.json"},
		{"GRPC_XDS_BOOTSTRAP", "GRPC_XDS_BOOTSTRAP=grpc/b.json", "grpc/b.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			env := []string{"POD_NAME=app-1", "POD_NAMESPACE=ns1", "INSTANCE_IP=10.1.2.3", "ISTIO_META_CLUSTER_ID=c1", "OUTPUT_CERTS=/var/lib/istio/data", tc.env}
			a := &Agent{s: resolve(t, settings.Flags{Root: root, DiscoveryAddress: "127.0.0.1:15010"}, env...), log: hclog.NewNullLogger()}
			if err := a.writeGRPCBootstrap(); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join(root, tc.path))
			if err != nil {
				t.Fatal(err)
			}
			var b grpcbootstrap.Bootstrap
			if err := json.Unmarshal(data, &b); err != nil {
				t.Fatal(err)
			}
			if got, want := b.XDSServers[0].ServerURI, "unix://"+filepath.Join(root, "etc/istio/proxy/XDS"); got != want {
				t.Errorf("server_uri = %q, want %q", got, want)
			}
			if got, want := b.Node.ID, "sidecar~10.1.2.3~app-1.ns1~ns1.svc.cluster.local"; got != want {
				t.Errorf("node id = %q, want %q", got, want)
			}
			for k, want := range map[string]any{"GENERATOR": "grpc", "CLUSTER_ID": "c1", "NAMESPACE": "ns1", "NAME": "app-1"} {
				if got := b.Node.Metadata[k]; got != want {
					t.Errorf("metadata %s = %v, want %v", k, got, want)
				}
			}
			if got := b.CertProviders["default"].Config.CertificateFile; got != "/var/lib/istio/data/cert-chain.pem" {
				t.Errorf("certificate_file = %q, want OUTPUT_CERTS' cert-chain.pem", got)
			}
		})
	}
}
