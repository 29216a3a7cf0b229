package ca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func csr(t *testing.T, uris ...string) (string, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.CertificateRequest{}
	for _, u := range uris {
		p, _ := url.Parse(u)
		tmpl.URIs = append(tmpl.URIs, p)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), key
}

func TestSign(t *testing.T) {
	rootFile := filepath.Join(t.TempDir(), "sub", "root-cert.pem")
	c, err := New(Options{RootFile: rootFile, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(rootFile); err != nil || string(b) != string(c.RootPEM()) {
		t.Fatalf("root file = %q, %v; want the CA root", b, err)
	}
	id := "spiffe://cluster.local/ns/a/sa/b"
	tests := []struct {
		name     string
		ttl      time.Duration
		wantLife time.Duration
	}{
		{"asked ttl honoured", 10 * time.Minute, 10 * time.Minute},
		{"no ttl gets the CA ttl", 0, time.Hour},
		{"longer ttl capped", 48 * time.Hour, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, key := csr(t, id)
			chain, err := c.Sign(p, tt.ttl)
			if err != nil {
				t.Fatal(err)
			}
			if len(chain) != 2 || chain[1] != string(c.RootPEM()) {
				t.Fatalf("chain has %d entries, want leaf + root", len(chain))
			}
			blk, _ := pem.Decode([]byte(chain[0]))
			leaf, _ := x509.ParseCertificate(blk.Bytes)
			if !leaf.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) {
				t.Error("leaf key is not the CSR's")
			}
			if leaf.URIs[0].String() != id {
				t.Errorf("leaf URI = %v, want %s", leaf.URIs, id)
			}
			if life := leaf.NotAfter.Sub(time.Now()); life > tt.wantLife || life < tt.wantLife-time.Minute {
				t.Errorf("leaf lifetime left = %v, want about %v", life, tt.wantLife)
			}
			pool := x509.NewCertPool()
			pool.AddCert(c.Root())
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("leaf does not verify as a client certificate: %v", err)
			}
		})
	}
}

func TestSignRejects(t *testing.T) {
	c, _ := New(Options{})
	noSAN, _ := csr(t)
	for name, in := range map[string]string{"garbage": "nope", "no URI SAN": noSAN} {
		if _, err := c.Sign(in, time.Hour); err == nil {
			t.Errorf("Sign(%s) = nil error, want an error", name)
		}
	}
}

func TestRun(t *testing.T) {
	c, _ := New(Options{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx, l) }()

	pool := x509.NewCertPool()
	pool.AddCert(c.Root())
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := csr(t, "spiffe://td/ns/a/sa/b")
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: p, ValidityDuration: 60})
	conn.Close()
	if err != nil || len(resp.GetCertChain()) != 2 {
		t.Fatalf("CreateCertificate = %v, %v; want a 2-entry chain", resp, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
}
