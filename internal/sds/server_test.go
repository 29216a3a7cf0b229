package sds

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/agentd/agentd/internal/caclient"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

func TestServeDefaultAndRootCA(t *testing.T) {
	tc := startCA(t)
	var s *sdsUnderTest
	o := withCA(t, tc, &s, spiffe("ns1", "sa1"), time.Hour)
	o.Key = caclient.KeyOptions{} // RSA 2048, Istio's default
	s = startSDS(t, o)
	conn := dial(t, s.sock)

	def := watch(t, conn, ResourceDefault).mustNext()[ResourceDefault]
	if def == nil {
		t.Fatal("no default secret")
	}
	pair(t, def)
	if got := uriOf(t, def); got != spiffe("ns1", "sa1") {
		t.Errorf("default identity = %s, want %s", got, spiffe("ns1", "sa1"))
	}
	if !strings.Contains(string(def.GetTlsCertificate().GetPrivateKey().GetInlineBytes()), "RSA PRIVATE KEY") {
		t.Error("default key is not the PKCS#1 RSA key Istio makes by default")
	}
	root := watch(t, conn, ResourceRootCA).mustNext()[ResourceRootCA]
	if !bytes.Equal(root.GetValidationContext().GetTrustedCa().GetInlineBytes(), tc.ca.RootPEM()) {
		t.Errorf("ROOTCA = %q, want the CA root", root.GetValidationContext().GetTrustedCa().GetInlineBytes())
	}
	if err := s.Ready(); err != nil {
		t.Errorf("Ready = %v, want nil with a certificate", err)
	}
	if got := s.metric(t, "istio_agent_num_outgoing_requests"); got != 1 {
		t.Errorf("istio_agent_num_outgoing_requests = %v, want 1 (one CSR for both resources)", got)
	}
	if got := s.metric(t, "istio_agent_cert_expiry_seconds"); got < 3000 || got > 3600 {
		t.Errorf("istio_agent_cert_expiry_seconds = %v, want about 3600", got)
	}

	t.Run("delta", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		st, err := secretv3.NewSecretDiscoveryServiceClient(conn).DeltaSecrets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: []string{ResourceDefault, ResourceRootCA}})
		got := map[string]bool{}
		for len(got) < 2 {
			resp, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range resp.GetResources() {
				got[r.GetName()] = true
			}
			st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.SecretType, ResponseNonce: resp.GetNonce()})
		}
		if !got[ResourceDefault] || !got[ResourceRootCA] {
			t.Errorf("delta resources = %v, want default and ROOTCA", got)
		}
	})
	t.Run("fetch unimplemented", func(t *testing.T) {
		_, err := secretv3.NewSecretDiscoveryServiceClient(conn).FetchSecrets(context.Background(), &discoveryv3.DiscoveryRequest{ResourceNames: []string{ResourceDefault}})
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("FetchSecrets = %v, want Unimplemented", err)
		}
	})
	t.Run("unknown resource", func(t *testing.T) {
		_, err := fetch(t, conn, "kubernetes://some-secret")
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("unknown resource: %v, want InvalidArgument", err)
		}
	})
}

// TestMutualTLS: two workloads with certificates from the SDS servers complete a mutual TLS
// handshake, each checking the other's SPIFFE identity.
func TestMutualTLS(t *testing.T) {
	tc := startCA(t)
	var a, b *sdsUnderTest
	a = startSDS(t, withCA(t, tc, &a, spiffe("ns-a", "client"), time.Hour))
	b = startSDS(t, withCA(t, tc, &b, spiffe("ns-b", "server"), time.Hour))
	ca, cb := dial(t, a.sock), dial(t, b.sock)
	aCert := pair(t, watch(t, ca, ResourceDefault).mustNext()[ResourceDefault])
	aRoots := pool(t, watch(t, ca, ResourceRootCA).mustNext()[ResourceRootCA])
	bCert := pair(t, watch(t, cb, ResourceDefault).mustNext()[ResourceDefault])
	bRoots := pool(t, watch(t, cb, ResourceRootCA).mustNext()[ResourceRootCA])

	srv := startMTLS(t, bCert, bRoots, spiffe("ns-a", "client"))
	dialMTLS(t, srv.addr, aCert, aRoots, spiffe("ns-b", "server"))

	// The identities are checked: a client expecting another server identity fails.
	if _, err := tlsDialErr(srv.addr, aCert, aRoots, spiffe("ns-b", "other")); err == nil {
		t.Error("handshake expecting another server identity succeeded")
	}
}

// TestRotation: with a TTL of a few seconds the certificate is rotated and pushed; a TLS
// connection opened before keeps working; new handshakes use the new certificate; the
// OUTPUT_CERTS files follow.
func TestRotation(t *testing.T) {
	tc := startCA(t)
	out := filepath.Join(t.TempDir(), "out")
	var a, b *sdsUnderTest
	oa := withCA(t, tc, &a, spiffe("ns-a", "client"), time.Hour)
	a = startSDS(t, oa)
	ob := withCA(t, tc, &b, spiffe("ns-b", "server"), 4*time.Second)
	ob.OutputDir = out
	b = startSDS(t, ob)
	ca, cb := dial(t, a.sock), dial(t, b.sock)
	aCert := pair(t, watch(t, ca, ResourceDefault).mustNext()[ResourceDefault])
	roots := pool(t, watch(t, ca, ResourceRootCA).mustNext()[ResourceRootCA])

	bw := watch(t, cb, ResourceDefault)
	first := bw.mustNext()[ResourceDefault]
	checkOutput(t, out, first)
	srv := startMTLS(t, pair(t, first), roots, spiffe("ns-a", "client"))
	old := dialMTLS(t, srv.addr, aCert, roots, spiffe("ns-b", "server"))

	second := bw.until(ResourceDefault, func(s *tlsv3.Secret) bool { return serial(t, s) != serial(t, first) })
	if got := uriOf(t, second); got != spiffe("ns-b", "server") {
		t.Errorf("rotated identity = %s", got)
	}
	checkOutput(t, out, second)
	srv.cert.Store(ptr(pair(t, second))) // what Envoy does with the pushed secret

	echo(t, old) // the connection opened before the rotation still works
	c := dialMTLS(t, srv.addr, aCert, roots, spiffe("ns-b", "server"))
	if got := c.ConnectionState().PeerCertificates[0].SerialNumber.String(); got != serial(t, second) {
		t.Errorf("new handshake saw certificate %s, want the rotated %s", got, serial(t, second))
	}
	// And a third rotation follows on its own.
	bw.until(ResourceDefault, func(s *tlsv3.Secret) bool { return serial(t, s) != serial(t, second) })
}

func checkOutput(t *testing.T, dir string, s *tlsv3.Secret) {
	t.Helper()
	want := map[string][]byte{
		"cert-chain.pem": s.GetTlsCertificate().GetCertificateChain().GetInlineBytes(),
		"key.pem":        s.GetTlsCertificate().GetPrivateKey().GetInlineBytes(),
	}
	for name, w := range want {
		p := filepath.Join(dir, name)
		eventually(t, "OUTPUT_CERTS "+name+" to follow the pushed secret", func() bool {
			b, err := os.ReadFile(p)
			return err == nil && bytes.Equal(b, w)
		})
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %v, want 0600", name, fi.Mode().Perm())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "root-cert.pem")); err != nil {
		t.Errorf("root-cert.pem: %v", err)
	}
}

// TestCADown: while the CA is down the cached certificate is served and retries are
// counted; once it is back a new certificate is issued and pushed.
func TestCADown(t *testing.T) {
	tc := startCA(t)
	var s *sdsUnderTest
	s = startSDS(t, withCA(t, tc, &s, spiffe("ns1", "sa1"), 8*time.Second))
	conn := dial(t, s.sock)
	w := watch(t, conn, ResourceDefault)
	first := w.mustNext()[ResourceDefault]
	addr := tc.addr
	tc.stop()

	eventually(t, "CA retries in istio_agent_num_outgoing_retries", func() bool {
		return s.metric(t, "istio_agent_num_outgoing_retries") > 0 && s.metric(t, "istio_agent_num_failed_outgoing_requests") > 0
	})
	cached, err := fetch(t, conn, ResourceDefault)
	if err != nil {
		t.Fatalf("default while the CA is down: %v", err)
	}
	if serial(t, cached) != serial(t, first) {
		t.Error("a new stream got another certificate while the CA is down, want the cached one")
	}
	if err := s.Ready(); err != nil {
		t.Errorf("Ready while the cached certificate is valid = %v, want nil", err)
	}

	tc.start(t, addr)
	next := w.until(ResourceDefault, func(x *tlsv3.Secret) bool { return serial(t, x) != serial(t, first) })
	if leaf(t, next).NotAfter.Before(leaf(t, first).NotAfter) {
		t.Error("the new certificate expires before the cached one")
	}
}

// TestBadCAAnswers: an answer no Envoy can use is rejected with a clear error and the old
// certificate stays served; the next good answer is pushed.
func TestBadCAAnswers(t *testing.T) {
	tc := startCA(t)
	var s *sdsUnderTest
	s = startSDS(t, withCA(t, tc, &s, spiffe("ns1", "sa1"), time.Hour))
	conn := dial(t, s.sock)
	w := watch(t, conn, ResourceDefault)
	good := w.mustNext()[ResourceDefault]

	tests := []struct {
		mode    string
		wantErr string
	}{
		{caShortChain, "fewer than 2 certificates"},
		{caOtherKey, "does not match the private key"},
		{caExpired, "expired at"},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			tc.mode.Store(tt.mode)
			failed := s.metric(t, "istio_agent_num_failed_outgoing_requests")
			err := s.mgr.renew(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("renew with a CA answer %q: error = %v, want one containing %q", tt.mode, err, tt.wantErr)
			}
			if got := s.metric(t, "istio_agent_num_failed_outgoing_requests"); got != failed+1 {
				t.Errorf("failed requests = %v, want %v", got, failed+1)
			}
			served, err := fetch(t, conn, ResourceDefault)
			if err != nil || serial(t, served) != serial(t, good) {
				t.Fatalf("after a bad answer default = %v, %v; want the old certificate", served, err)
			}
		})
	}
	tc.mode.Store(caGood)
	if err := s.mgr.renew(context.Background()); err != nil {
		t.Fatalf("renew with a good answer: %v", err)
	}
	w.until(ResourceDefault, func(x *tlsv3.Secret) bool { return serial(t, x) != serial(t, good) })
}

// TestCAAnswersIstioTakes: answers Istio's agent takes are served, each pushed in turn: a
// leaf of another CA, a chain to another root (a root migration, a plugged-in CA: ROOTCA
// becomes that root), a leaf not valid yet (the CA's clock ahead).
func TestCAAnswersIstioTakes(t *testing.T) {
	tc := startCA(t)
	var s *sdsUnderTest
	s = startSDS(t, withCA(t, tc, &s, spiffe("ns1", "sa1"), time.Hour))
	conn := dial(t, s.sock)
	w := watch(t, conn, ResourceDefault)
	last := w.mustNext()[ResourceDefault]
	for _, mode := range []string{caForeignLeaf, caForeignChain, caNotYetValid} {
		t.Run(mode, func(t *testing.T) {
			tc.mode.Store(mode)
			if err := s.mgr.renew(context.Background()); err != nil {
				t.Fatalf("renew with a CA answer %q: %v, want it taken as Istio takes it", mode, err)
			}
			last = w.until(ResourceDefault, func(x *tlsv3.Secret) bool { return serial(t, x) != serial(t, last) })
			pair(t, last)
			if mode != caForeignChain {
				return
			}
			root, err := fetch(t, conn, ResourceRootCA)
			if err != nil || !bytes.Equal(rootsOf(root), tc.rogue.RootPEM()) {
				t.Errorf("ROOTCA after an answer with another root = %v, %v; want that root", root, err)
			}
		})
	}
}

// TestPlaintextCAWithoutRoot: with the CA plaintext on port 15010 and no root file where the
// configuration points (Istio's var/run/secrets/istio/root-cert.pem, not mounted), sds-server
// is ready before any certificate, gets one, and sends the cluster ID as given ("" unset).
func TestPlaintextCAWithoutRoot(t *testing.T) {
	tc := startPlaintextCA(t)
	tc.hold = make(chan struct{})
	root := t.TempDir()
	missing := "var/run/secrets/istio/root-cert.pem"
	cfg := &agentv1.SDSConfig{CaAddress: tc.addr, CaRootCert: missing, TrustDomain: "cluster.local", EccSignatureAlgorithm: "ECDSA"}
	o, err := configFrom(cfg, root)
	if err != nil {
		t.Fatal(err)
	}
	var s *sdsUnderTest
	cl, err := CAClient(cfg, root, func(err error) { s.OnRetry(err) })
	if err != nil {
		t.Fatalf("CA client for plaintext %s without a root file: %v", tc.addr, err)
	}
	t.Cleanup(func() { cl.Close() })
	o.CA = cl
	s = startSDS(t, o) // waits until Ready
	eventually(t, "the first CSR", func() bool { return tc.calls.Load() > 0 })
	if err := s.Ready(); err != nil {
		t.Errorf("Ready while the first CSR is pending = %v, want nil (Istio's readiness does not wait for it)", err)
	}
	close(tc.hold)
	def, err := fetch(t, dial(t, s.sock), ResourceDefault)
	if err != nil {
		t.Fatalf("default from a plaintext CA without a root file: %v", err)
	}
	if got := uriOf(t, def); got != spiffe("default", "default") {
		t.Errorf("default identity = %s", got)
	}
	if _, err := os.Stat(filepath.Join(root, missing)); !os.IsNotExist(err) {
		t.Errorf("the root file %s exists (%v): the test must run without it", missing, err)
	}
	if md := tc.lastMD.Load(); md == nil || len(md.Get("clusterid")) != 1 || md.Get("clusterid")[0] != "" {
		t.Errorf("clusterid header = %v, want the configured \"\" as it is", md)
	}
}

// TestTrustBundle: PCDS roots join ROOTCA, and the workload certificate is re-issued.
func TestTrustBundle(t *testing.T) {
	tc := startCA(t)
	var s *sdsUnderTest
	o := withCA(t, tc, &s, spiffe("ns1", "sa1"), time.Hour)
	o.OutputDir = filepath.Join(t.TempDir(), "out")
	s = startSDS(t, o)
	conn := dial(t, s.sock)
	rw := watch(t, conn, ResourceRootCA)
	rw.mustNext()
	dw := watch(t, conn, ResourceDefault)
	first := dw.mustNext()[ResourceDefault]

	extra := string(tc.rogue.RootPEM())
	s.SetTrustBundle([]string{extra})
	roots := rw.until(ResourceRootCA, func(x *tlsv3.Secret) bool {
		return bytes.Contains(x.GetValidationContext().GetTrustedCa().GetInlineBytes(), []byte(extra))
	})
	if !bytes.Contains(roots.GetValidationContext().GetTrustedCa().GetInlineBytes(), tc.ca.RootPEM()) {
		t.Error("ROOTCA lost the CA root when the trust bundle was added")
	}
	dw.until(ResourceDefault, func(x *tlsv3.Secret) bool { return serial(t, x) != serial(t, first) })
	eventually(t, "root-cert.pem to hold the bundle", func() bool {
		b, _ := os.ReadFile(filepath.Join(o.OutputDir, "root-cert.pem"))
		return bytes.Contains(b, []byte(extra))
	})
}

func TestRotateAt(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	expire := created.Add(24 * time.Hour)
	tests := []struct {
		ratio, jitter, u float64
		want             time.Time
	}{
		{0.5, 0, 0, created.Add(12 * time.Hour)},
		{0.5, 0.01, 1, created.Add(12*time.Hour - 864*time.Second)},
		{0.5, 0.01, -1, created.Add(12*time.Hour + 864*time.Second)},
		{0.99, 0.1, 1, created}, // clamped to 1: rotate at once
		{0.01, 0.1, -1, expire}, // clamped to 0: at expiry
	}
	for _, tt := range tests {
		if got := rotateAt(created, expire, tt.ratio, tt.jitter, tt.u); !got.Equal(tt.want) {
			t.Errorf("rotateAt(ratio %v, jitter %v, u %v) = %v, want %v", tt.ratio, tt.jitter, tt.u, got, tt.want)
		}
	}
}

func TestParseFileResource(t *testing.T) {
	tests := []struct {
		name string
		want fileResource
		ok   bool
	}{
		{"file-cert:/a/cert.pem~/a/key.pem", fileResource{cert: "/a/cert.pem", key: "/a/key.pem"}, true},
		{"file-root:/a/ca.pem", fileResource{root: "/a/ca.pem"}, true},
		{"file-cert:/a/cert.pem", fileResource{}, false},
		{"file-cert:a~b~c", fileResource{}, false},
		{"file-root:a~b", fileResource{}, false},
		{"file-root:", fileResource{}, false},
		{"default", fileResource{}, false},
	}
	for _, tt := range tests {
		got, ok := parseFileResource(tt.name)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseFileResource(%q) = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestNoWildcard: a request that names no secret is not answered with every secret held.
func TestNoWildcard(t *testing.T) {
	c1 := mustCA(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	p := newPair(t, c1, "spiffe://td/a")
	write(t, cert, p.cert)
	write(t, key, p.key)
	s := startSDS(t, Options{FilesOnly: true})
	conn := dial(t, s.sock)
	if _, err := fetch(t, conn, FileCertResource(cert, key)); err != nil {
		t.Fatal(err)
	}
	m := watch(t, conn).mustNext() // no names
	if len(m) != 0 {
		t.Errorf("a request without names got %d secrets, want none", len(m))
	}
}
