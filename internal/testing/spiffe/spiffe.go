// Package spiffe checks a mesh peer as a workload does in mutual TLS: its certificate chains to
// the trust roots and names exactly the expected SPIFFE identity.
package spiffe

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// VerifyPeer returns a tls.Config.VerifyConnection that accepts only a peer whose chain
// verifies against roots and whose single URI SAN is want (spiffe://<td>/ns/<ns>/sa/<sa>).
// SPIFFE certificates carry no host name, so it goes with InsecureSkipVerify on clients.
func VerifyPeer(roots *x509.CertPool, want string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("peer sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		p := cs.PeerCertificates[0]
		if _, err := p.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return fmt.Errorf("peer certificate: %w", err)
		}
		if len(p.URIs) != 1 || p.URIs[0].String() != want {
			return fmt.Errorf("peer identity %v, want %s", p.URIs, want)
		}
		return nil
	}
}
