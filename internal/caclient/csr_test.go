package caclient

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"runtime"
	"testing"
)

func TestNewCSR(t *testing.T) {
	id := SPIFFEID("cluster.local", "ns1", "sa1")
	tests := []struct {
		name    string
		opts    KeyOptions
		pemType string
		check   func(any) bool
	}{
		{"rsa default", KeyOptions{}, "RSA PRIVATE KEY", rsaBits(2048)},
		{"rsa below minimum", KeyOptions{RSAKeySize: 1024}, "RSA PRIVATE KEY", rsaBits(2048)},
		{"rsa 3072", KeyOptions{RSAKeySize: 3072}, "RSA PRIVATE KEY", rsaBits(3072)},
		{"rsa pkcs8", KeyOptions{PKCS8: true}, "PRIVATE KEY", rsaBits(2048)},
		{"ecdsa default curve", KeyOptions{ECCSignatureAlgorithm: "ECDSA"}, "EC PRIVATE KEY", curve(elliptic.P256())},
		{"ecdsa P384", KeyOptions{ECCSignatureAlgorithm: "ECDSA", ECCCurve: "P384"}, "EC PRIVATE KEY", curve(elliptic.P384())},
		{"ecdsa pkcs8", KeyOptions{ECCSignatureAlgorithm: "ECDSA", PKCS8: true}, "PRIVATE KEY", curve(elliptic.P256())},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			csrPEM, keyPEM, key, err := NewCSR(tt.opts, id)
			if err != nil {
				t.Fatalf("NewCSR(%+v) error: %v", tt.opts, err)
			}
			blk, _ := pem.Decode(keyPEM)
			if blk == nil || blk.Type != tt.pemType {
				t.Fatalf("key PEM type = %v, want %q", blk, tt.pemType)
			}
			if !tt.check(key) {
				t.Errorf("key %T does not have the asked size or curve", key)
			}
			cblk, _ := pem.Decode(csrPEM)
			csr, err := x509.ParseCertificateRequest(cblk.Bytes)
			if err != nil {
				t.Fatalf("parse CSR: %v", err)
			}
			if err := csr.CheckSignature(); err != nil {
				t.Errorf("CSR signature: %v", err)
			}
			if len(csr.URIs) != 1 || csr.URIs[0].String() != id {
				t.Errorf("CSR URIs = %v, want [%s]", csr.URIs, id)
			}
			if !csr.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(key.Public()) {
				t.Error("CSR public key is not the returned key's")
			}
			// The key PEM must be loadable by crypto/tls, which is what Envoy's peers use.
			if _, err := tlsKey(keyPEM); err != nil {
				t.Errorf("key PEM not loadable: %v", err)
			}
		})
	}
}

func TestNewCSRErrors(t *testing.T) {
	for _, o := range []KeyOptions{
		{ECCSignatureAlgorithm: "ECDSA", ECCCurve: "P521"},
		{ECCSignatureAlgorithm: "ED25519"},
	} {
		if _, _, _, err := NewCSR(o, "spiffe://td/ns/a/sa/b"); err == nil {
			t.Errorf("NewCSR(%+v) = nil error, want an error", o)
		}
	}
}

func rsaBits(n int) func(any) bool {
	return func(k any) bool { r, ok := k.(*rsa.PrivateKey); return ok && r.N.BitLen() == n }
}

func curve(c elliptic.Curve) func(any) bool {
	return func(k any) bool { e, ok := k.(*ecdsa.PrivateKey); return ok && e.Curve == c }
}

func tlsKey(keyPEM []byte) (any, error) {
	blk, _ := pem.Decode(keyPEM)
	switch blk.Type {
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(blk.Bytes)
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(blk.Bytes)
	}
	return x509.ParsePKCS8PrivateKey(blk.Bytes)
}

// TestWithSparePRestores: an RSA key is generated with a second P in a process of one, which
// is one again afterwards; a process of more keeps its own.
func TestWithSpareP(t *testing.T) {
	old := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(old)
	for _, tt := range []struct{ before, during int }{{1, 2}, {2, 2}, {4, 4}} {
		runtime.GOMAXPROCS(tt.before)
		var during int
		withSpareP(func() { during = runtime.GOMAXPROCS(0) })
		if after := runtime.GOMAXPROCS(0); during != tt.during || after != tt.before {
			t.Errorf("GOMAXPROCS %d: %d during, %d after; want %d during, %d after", tt.before, during, after, tt.during, tt.before)
		}
	}
}
