package caclient

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"
)

// FuzzParsePEMCerts: certificate files and CA answers, garbage included, never panic; what is
// accepted is at least one certificate, and the certificates PEM-encoded again parse to the
// same ones.
func FuzzParsePEMCerts(f *testing.F) {
	cert := selfSignedPEM(f)
	f.Add(cert)
	f.Add(append(append([]byte{}, cert...), cert...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"))
	f.Add(append([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), cert[:len(cert)/2]...))
	f.Fuzz(func(t *testing.T, b []byte) {
		certs, err := ParsePEMCerts(b)
		if err != nil {
			return
		}
		if len(certs) == 0 {
			t.Fatal("accepted no certificate")
		}
		var again []byte
		for _, c := range certs {
			again = append(again, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
		back, err := ParsePEMCerts(again)
		if err != nil || len(back) != len(certs) {
			t.Fatalf("re-encoded certificates: %d, %v; want %d", len(back), err, len(certs))
		}
		for i := range back {
			if !bytes.Equal(back[i].Raw, certs[i].Raw) {
				t.Fatalf("certificate %d changed by a PEM round trip", i)
			}
		}
	})
}

func selfSignedPEM(tb testing.TB) []byte {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fuzz"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
