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

// Verify checks a CA answer before it is used and returns its parsed leaf. It checks what
// Istio's agent checks, at least two certificates (leaf first, root last), and what makes the
// answer servable at all: every certificate parses, the leaf holds the CSR's public key pub,
// and it has not expired at now. A pair that fails these cannot work in Envoy, so the cached
// certificate stays served instead.
//
// Like Istio's agent, it does not require the chain to verify, nor to end at a root mounted
// in the pod: during a root migration, or with a plugged-in CA, the answer chains to a root
// that is not (yet) the mounted one. A leaf not yet valid (the CA's clock ahead) is accepted
// too: peers with other clocks may take it, and rejecting it would leave no certificate.
func Verify(chain []string, pub crypto.PublicKey, now time.Time) (*x509.Certificate, error) {
	if len(chain) < 2 {
		return nil, fmt.Errorf("%w: got %d", ErrShortChain, len(chain))
	}
	var leaf *x509.Certificate
	for i, p := range chain {
		c, err := ParsePEMCerts([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("CA answer certificate %d: %w", i, err)
		}
		if i == 0 {
			leaf = c[0]
		}
	}
	if k, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(pub) {
		return nil, fmt.Errorf("certificate from CA (serial %s) does not match the private key of the CSR", leaf.SerialNumber)
	}
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate from CA expired at %s (now %s)", leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
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
