package caclient

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"
)

// ErrShortChain is returned for a CA answer with fewer than two certificates (Istio: "invalid
// empty CertChain"): the chain must hold the leaf first and the root last.
var ErrShortChain = errors.New("CA answer holds fewer than 2 certificates (want leaf ... root)")

// Verify checks a CA answer before it is used: at least two certificates, a leaf whose public
// key is pub, valid at now, that chains through the answer's intermediates to a trusted root.
// The trusted roots are anchors when given, else the answer's last certificate. It returns
// the parsed leaf.
func Verify(chain []string, pub crypto.PublicKey, anchors []*x509.Certificate, now time.Time) (*x509.Certificate, error) {
	if len(chain) < 2 {
		return nil, fmt.Errorf("%w: got %d", ErrShortChain, len(chain))
	}
	var certs []*x509.Certificate
	for i, p := range chain {
		c, err := ParsePEMCerts([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("CA answer certificate %d: %w", i, err)
		}
		certs = append(certs, c...)
	}
	leaf := certs[0]
	if k, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(pub) {
		return nil, fmt.Errorf("certificate from CA (serial %s) does not match the private key of the CSR", leaf.SerialNumber)
	}
	if now.Before(leaf.NotBefore) {
		return nil, fmt.Errorf("certificate from CA is not valid before %s (now %s)", leaf.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate from CA expired at %s (now %s)", leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	roots := x509.NewCertPool()
	source := "the answer's root"
	if len(anchors) > 0 {
		source = fmt.Sprintf("the %d trusted roots", len(anchors))
		for _, a := range anchors {
			roots.AddCert(a)
		}
	} else {
		roots.AddCert(certs[len(certs)-1])
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return nil, fmt.Errorf("certificate from CA does not chain to %s: %w", source, err)
	}
	return leaf, nil
}

// ParsePEMCerts parses every CERTIFICATE block of b; it fails if there is none or one is bad.
func ParsePEMCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return out, nil
}
