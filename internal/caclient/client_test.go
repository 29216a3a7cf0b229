package caclient

import (
	"context"
	"crypto/tls"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/agentd/agentd/internal/testing/ca"
)

// recordingCA is the real CA behind a server that records what each call carried and can
// fail the first calls with a given code.
type recordingCA struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	ca *ca.CA

	failCode codes.Code
	failures atomic.Int32 // calls left to fail

	mu    sync.Mutex
	md    []metadata.MD
	reqs  []*securityv1alpha1.IstioCertificateRequest
	calls int
}

func (r *recordingCA) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	r.mu.Lock()
	r.md = append(r.md, md)
	r.reqs = append(r.reqs, req)
	r.calls++
	r.mu.Unlock()
	if r.failures.Add(-1) >= 0 {
		return nil, status.Error(r.failCode, "injected failure")
	}
	return r.ca.CreateCertificate(ctx, req)
}

func (r *recordingCA) last() (metadata.MD, *securityv1alpha1.IstioCertificateRequest, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.md[len(r.md)-1], r.reqs[len(r.reqs)-1], r.calls
}

// startCA serves rec over TLS on a loopback port and returns its address and root file.
func startCA(t testing.TB, hosts []string) (*recordingCA, string, string) {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root-cert.pem")
	c, err := ca.New(ca.Options{RootFile: root, TTL: time.Hour, Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingCA{ca: c}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(c.ServerTLS())))
	securityv1alpha1.RegisterIstioCertificateServiceServer(s, rec)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return rec, l.Addr().String(), root
}

func TestSign(t *testing.T) {
	rec, addr, root := startCA(t, nil)
	token := filepath.Join(t.TempDir(), "istio-token")
	if err := os.WriteFile(token, []byte("token-one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{
		Address: addr, RootCertFile: root, TokenFile: token, ClusterID: "Kubernetes",
		Headers: map[string]string{"X-Extra": "v1"}, CertSigner: "signer-a",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for i, tok := range []string{"token-one", "token-two"} {
		if i > 0 { // the token is read fresh on every call
			if err := os.WriteFile(token, []byte(tok), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		csr, _, key, err := NewCSR(KeyOptions{ECCSignatureAlgorithm: "ECDSA"}, SPIFFEID("cluster.local", "ns1", "sa1"))
		if err != nil {
			t.Fatal(err)
		}
		chain, err := c.Sign(ctx, csr, 30*time.Minute)
		if err != nil {
			t.Fatalf("Sign: %v", err)
		}
		leaf, err := Verify(chain, key.Public(), time.Now())
		if err != nil {
			t.Fatalf("Verify: %v", err)
		}
		if got := leaf.URIs[0].String(); got != "spiffe://cluster.local/ns/ns1/sa/sa1" {
			t.Errorf("leaf URI = %s", got)
		}
		if d := time.Until(leaf.NotAfter); d > 31*time.Minute || d < 29*time.Minute {
			t.Errorf("leaf lifetime left = %v, want about the asked 30m", d)
		}
		md, req, _ := rec.last()
		want := map[string]string{"authorization": "Bearer " + tok, "clusterid": "Kubernetes", "x-extra": "v1"}
		for k, v := range want {
			if got := md.Get(k); len(got) != 1 || got[0] != v {
				t.Errorf("header %s = %v, want %q", k, got, v)
			}
		}
		if got := req.GetMetadata().GetFields()["CertSigner"].GetStringValue(); got != "signer-a" {
			t.Errorf("CertSigner metadata = %q, want signer-a", got)
		}
		if req.GetValidityDuration() != 1800 {
			t.Errorf("validity_duration = %d, want 1800", req.GetValidityDuration())
		}
	}
}

func TestSignNoToken(t *testing.T) {
	rec, addr, root := startCA(t, nil)
	c, _ := New(Options{Address: addr, RootCertFile: root, TokenFile: filepath.Join(t.TempDir(), "missing")})
	defer c.Close()
	csr, _, _, _ := NewCSR(KeyOptions{ECCSignatureAlgorithm: "ECDSA"}, "spiffe://td/ns/a/sa/b")
	if _, err := c.Sign(context.Background(), csr, time.Hour); err != nil {
		t.Fatalf("Sign: %v", err)
	}
	md, req, _ := rec.last()
	if got := md.Get("authorization"); len(got) != 0 {
		t.Errorf("authorization = %v, want none for a missing token file", got)
	}
	// As Istio: CertSigner and ClusterID are sent even when empty (istiod reads "" as its own
	// cluster); nothing defaults them here.
	if v, ok := req.GetMetadata().GetFields()["CertSigner"]; !ok || v.GetStringValue() != "" {
		t.Errorf("metadata = %v, want {CertSigner: \"\"}", req.GetMetadata())
	}
	if got := md.Get("clusterid"); len(got) != 1 || got[0] != "" {
		t.Errorf("clusterid = %q, want one empty value", got)
	}
}

func TestSignRetries(t *testing.T) {
	tests := []struct {
		name        string
		code        codes.Code
		failures    int32
		wantErr     bool
		wantCalls   int
		wantRetries int
	}{
		{"unavailable twice then ok", codes.Unavailable, 2, false, 3, 2},
		{"internal always", codes.Internal, 100, true, 5, 4},
		{"invalid argument is final", codes.InvalidArgument, 100, true, 1, 0},
		{"permission denied is final", codes.PermissionDenied, 100, true, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, addr, root := startCA(t, nil)
			rec.failCode = tt.code
			rec.failures.Store(tt.failures)
			var retries atomic.Int32
			c, _ := New(Options{Address: addr, RootCertFile: root, OnRetry: func(error) { retries.Add(1) }})
			defer c.Close()
			csr, _, _, _ := NewCSR(KeyOptions{ECCSignatureAlgorithm: "ECDSA"}, "spiffe://td/ns/a/sa/b")
			_, err := c.Sign(context.Background(), csr, time.Hour)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Sign error = %v, want error %v", err, tt.wantErr)
			}
			if _, _, calls := rec.last(); calls != tt.wantCalls {
				t.Errorf("calls = %d, want %d", calls, tt.wantCalls)
			}
			if int(retries.Load()) != tt.wantRetries {
				t.Errorf("retries = %d, want %d", retries.Load(), tt.wantRetries)
			}
		})
	}
}

func TestSignServerName(t *testing.T) {
	_, addr, root := startCA(t, []string{"istiod.istio-system.svc"})
	_, port, _ := net.SplitHostPort(addr)
	tests := []struct {
		name       string
		addr       string
		serverName string
		wantErr    bool
	}{
		{"ip not in certificate", addr, "", true},
		{"ISTIOD_SAN override", addr, "istiod.istio-system.svc", false},
		{"localhost read as istiod", "localhost:" + port, "", false},
		{"wrong SAN", addr, "other.example", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := New(Options{Address: tt.addr, RootCertFile: root, ServerName: tt.serverName})
			defer c.Close()
			csr, _, _, _ := NewCSR(KeyOptions{ECCSignatureAlgorithm: "ECDSA"}, "spiffe://td/ns/a/sa/b")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := c.Sign(ctx, csr, time.Hour)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Sign error = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}

func TestSignUntrustedServer(t *testing.T) {
	_, addr, _ := startCA(t, nil)
	other, err := ca.New(ca.Options{RootFile: filepath.Join(t.TempDir(), "other.pem")})
	if err != nil {
		t.Fatal(err)
	}
	otherRoot := filepath.Join(t.TempDir(), "other-root.pem")
	os.WriteFile(otherRoot, other.RootPEM(), 0o644)
	c, _ := New(Options{Address: addr, RootCertFile: otherRoot})
	defer c.Close()
	csr, _, _, _ := NewCSR(KeyOptions{ECCSignatureAlgorithm: "ECDSA"}, "spiffe://td/ns/a/sa/b")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Sign(ctx, csr, time.Hour); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Sign to a CA with an untrusted certificate: error = %v, want a certificate error", err)
	}
}

func TestPlaintext(t *testing.T) {
	for addr, want := range map[string]bool{
		"istiod.istio-system.svc:15010": true, "istiod.istio-system.svc:15012": false, "127.0.0.1:150100": false,
	} {
		if got := Plaintext(addr); got != want {
			t.Errorf("Plaintext(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestVerify: what a CA answer must be before it is served. Answers Istio's agent takes are
// taken (another root, a leaf not yet valid); answers no Envoy can use are refused.
func TestVerify(t *testing.T) {
	good, _ := ca.New(ca.Options{})
	rogue, _ := ca.New(ca.Options{})
	_, _, key, _ := NewCSR(KeyOptions{ECCSignatureAlgorithm: "ECDSA"}, "spiffe://td/ns/a/sa/b")
	_, _, otherKey, _ := NewCSR(KeyOptions{ECCSignatureAlgorithm: "ECDSA"}, "spiffe://td/ns/a/sa/b")
	uris := []*url.URL{{Scheme: "spiffe", Host: "td", Path: "/ns/a/sa/b"}}
	now := time.Now()
	issue := func(c *ca.CA, pub any, nb, na time.Time) string {
		p, err := c.Issue(pub, uris, nb, na)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	valid := issue(good, key.Public(), now.Add(-time.Minute), now.Add(time.Hour))
	goodRoot, rogueRoot := string(good.RootPEM()), string(rogue.RootPEM())
	tests := []struct {
		name    string
		chain   []string
		wantErr string
	}{
		{"valid", []string{valid, goodRoot}, ""},
		{"another CA's root (root migration, plugged-in CA)", []string{issue(rogue, key.Public(), now.Add(-time.Minute), now.Add(time.Hour)), rogueRoot}, ""},
		{"leaf not signed by the answer's root", []string{issue(rogue, key.Public(), now.Add(-time.Minute), now.Add(time.Hour)), goodRoot}, ""},
		{"not yet valid", []string{issue(good, key.Public(), now.Add(time.Hour), now.Add(2*time.Hour)), goodRoot}, ""},
		{"one certificate", []string{valid}, "fewer than 2"},
		{"empty", nil, "fewer than 2"},
		{"other key", []string{issue(good, otherKey.Public(), now.Add(-time.Minute), now.Add(time.Hour)), goodRoot}, "does not match the private key"},
		{"expired", []string{issue(good, key.Public(), now.Add(-2*time.Hour), now.Add(-time.Hour)), goodRoot}, "expired at"},
		{"garbage leaf", []string{"not a certificate", goodRoot}, "no PEM certificate"},
		{"garbage root", []string{valid, "not a certificate"}, "no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Verify(tt.chain, key.Public(), now)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Verify = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Verify = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestIssuedPairLoads checks that the key PEM and the signed chain form a pair crypto/tls
// accepts, for each key kind.
func TestIssuedPairLoads(t *testing.T) {
	_, addr, root := startCA(t, nil)
	c, _ := New(Options{Address: addr, RootCertFile: root})
	defer c.Close()
	for _, o := range []KeyOptions{{}, {PKCS8: true}, {ECCSignatureAlgorithm: "ECDSA"}, {ECCSignatureAlgorithm: "ECDSA", ECCCurve: "P384", PKCS8: true}} {
		csr, keyPEM, _, err := NewCSR(o, "spiffe://td/ns/a/sa/b")
		if err != nil {
			t.Fatal(err)
		}
		chain, err := c.Sign(context.Background(), csr, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tls.X509KeyPair([]byte(strings.Join(chain, "")), keyPEM); err != nil {
			t.Errorf("X509KeyPair for %+v: %v", o, err)
		}
	}
}
