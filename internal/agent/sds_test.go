package agent

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/agentd/agentd/internal/settings"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

func TestSDSConfig(t *testing.T) {
	base := &agentv1.SDSConfig{
		CaAddress: "istiod.istio-system.svc:15012", CaRootCert: settings.IstiodRootCert,
		TokenFile: settings.TokenFile, CaHeaders: map[string]string{}, TrustDomain: "cluster.local",
		SecretTtl: durationpb.New(24 * time.Hour), FileDebounce: durationpb.New(100 * time.Millisecond),
		GracePeriodRatio: 0.5, GracePeriodRatioJitter: 0.01, RsaKeySize: 2048, EccCurve: "P256",
		CertChainFile: "etc/certs/cert-chain.pem", KeyFile: "etc/certs/key.pem", RootCertFile: "etc/certs/root-cert.pem",
	}
	with := func(f func(c *agentv1.SDSConfig)) *agentv1.SDSConfig {
		c := proto.Clone(base).(*agentv1.SDSConfig)
		f(c)
		return c
	}
	tests := []struct {
		name  string
		env   []string
		files []string
		want  *agentv1.SDSConfig
	}{
		{"defaults", nil, nil, base},
		{"istio settings", []string{
			"CA_ADDR=127.0.0.1:15012", "CA_ROOT_CA=/ca/root.pem", "ISTIOD_SAN=ignored.when.ca.addr.set",
			"ISTIO_META_CLUSTER_ID=c1", "CA_HEADER_X-Tenant=t1", "ISTIO_META_CERT_SIGNER=s1",
			"TRUST_DOMAIN=td", "POD_NAMESPACE=ns", "SERVICE_ACCOUNT=sa", "SECRET_TTL=1h",
			"SECRET_GRACE_PERIOD_RATIO=0.3", "SECRET_GRACE_PERIOD_RATIO_JITTER=0.05", "WORKLOAD_RSA_KEY_SIZE=4096",
			"ECC_SIGNATURE_ALGORITHM=ECDSA", "ECC_CURVE=P384", "PKCS8_KEY=true", "OUTPUT_CERTS=/out",
			"KUBERNETES_SERVICE_HOST=10.0.0.1", "FILE_DEBOUNCE_DURATION=1s",
		}, nil, with(func(c *agentv1.SDSConfig) {
			c.CaAddress, c.CaRootCert = "127.0.0.1:15012", "/ca/root.pem"
			c.ClusterId, c.CaHeaders, c.CertSigner = "c1", map[string]string{"X-Tenant": "t1"}, "s1"
			c.TrustDomain, c.PodNamespace, c.ServiceAccount = "td", "ns", "sa"
			c.SecretTtl, c.GracePeriodRatio, c.GracePeriodRatioJitter = durationpb.New(time.Hour), 0.3, 0.05
			c.RsaKeySize, c.EccSignatureAlgorithm, c.EccCurve, c.Pkcs8Key = 4096, "ECDSA", "P384", true
			c.OutputCerts, c.OutputWorldReadable, c.FileDebounce = "/out", true, durationpb.New(time.Second)
		})},
		{"defaulted CA address takes ISTIOD_SAN", []string{"ISTIOD_SAN=istiod.example"}, nil, with(func(c *agentv1.SDSConfig) {
			c.CaServerName = "istiod.example"
		})},
		{"system roots are no trust anchors", []string{"CA_ROOT_CA=SYSTEM"}, nil, with(func(c *agentv1.SDSConfig) {
			c.CaRootCert = "SYSTEM"
		})},
		{"PROV_CERT root", []string{"PROV_CERT=/prov"}, nil, with(func(c *agentv1.SDSConfig) {
			c.CaRootCert = "/prov/root-cert.pem"
		})},
		{"file mounted: no CA", []string{"FILE_MOUNTED_CERTS=true"}, nil, with(func(c *agentv1.SDSConfig) {
			c.CaAddress, c.CaRootCert = "", ""
		})},
		{"workload-spiffe-credentials", nil, []string{"cert-chain.pem", "key.pem", "root-cert.pem"}, with(func(c *agentv1.SDSConfig) {
			c.CaAddress, c.CaRootCert = "", ""
			c.CertChainFile, c.KeyFile, c.RootCertFile = settings.WorkloadCertDir+"/cert-chain.pem", settings.WorkloadCertDir+"/key.pem", settings.WorkloadCertDir+"/root-cert.pem"
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for _, f := range tt.files {
				p := filepath.Join(root, settings.WorkloadCertDir, f)
				os.MkdirAll(filepath.Dir(p), 0o755)
				os.WriteFile(p, []byte("x"), 0o600)
			}
			got, _, err := sdsConfig(resolve(t, settings.Flags{Root: root, DiscoveryAddress: "istiod.istio-system.svc:15012"}, tt.env...))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got, protocmp.Transform()); d != "" {
				t.Errorf("sdsConfig (-want +got):\n%s", d)
			}
		})
	}
	// A value that does not parse is warned about and Istio's default used, as Istio does.
	for _, bad := range []string{"SECRET_TTL=soon", "SECRET_GRACE_PERIOD_RATIO=2", "PKCS8_KEY=maybe", "WORKLOAD_RSA_KEY_SIZE=big"} {
		got, _, err := sdsConfig(resolve(t, settings.Flags{DiscoveryAddress: "istiod.istio-system.svc:15012"}, bad))
		if err != nil {
			t.Fatalf("sdsConfig with %s: %v", bad, err)
		}
		if d := cmp.Diff(base, got, protocmp.Transform()); d != "" {
			t.Errorf("sdsConfig with %s (-want defaults +got):\n%s", bad, d)
		}
	}
}

// TestSDSSocket: a live SDS server (SPIRE) on the workload socket turns sds-server into a
// files-only server on the files socket.
func TestSDSSocket(t *testing.T) {
	root, err := os.MkdirTemp("", "sds") // short: Unix socket path limit
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	_, sock, err := sdsConfig(resolve(t, settings.Flags{Root: root, DiscoveryAddress: "x:15012"}))
	if err != nil {
		t.Fatal(err)
	}
	if s := sock; s.Name != agentv1.SocketSDSWorkload || s.Address != settings.SDSSocketDir+"/socket" {
		t.Errorf("socket = %+v, want the workload socket", s)
	}
	path := filepath.Join(root, settings.SDSSocketDir, "socket")
	os.MkdirAll(filepath.Dir(path), 0o755)
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, sock, err = sdsConfig(resolve(t, settings.Flags{Root: root, DiscoveryAddress: "x:15012"})); err != nil {
		t.Fatal(err)
	}
	if s := sock; s.Name != agentv1.SocketSDSFiles || s.Address != settings.SDSFilesSocket {
		t.Errorf("socket with a live SDS server = %+v, want the files socket", s)
	}
}
