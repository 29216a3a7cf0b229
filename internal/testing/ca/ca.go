// Package ca is a small certificate authority that serves Istio's CA API
// (IstioCertificateService) over TLS, for devplane and tests.
package ca

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
)

// DefaultHosts are the names and addresses the CA's serving certificate carries by default.
var DefaultHosts = []string{"istiod.istio-system.svc", "localhost", "127.0.0.1", "::1"}

// backdate is how far before issuance a certificate's validity starts, for clock skew.
const backdate = time.Minute

// Options configures a CA. The zero value works.
type Options struct {
	// RootFile, when set, is where the root certificate is written (PEM, 0644), for agents'
	// CA_ROOT_CA.
	RootFile string
	// TTL is the longest lifetime the CA issues, and the lifetime of a request that asks for
	// none; default 24h. Shorter requested lifetimes are honoured.
	TTL time.Duration
	// Hosts are the DNS names and IPs of the TLS serving certificate; default DefaultHosts.
	Hosts []string
	// Log receives one line per issued certificate; default silent.
	Log hclog.Logger
}

// CA is a self-rooted certificate authority. It is safe for concurrent use.
type CA struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer

	ttl     time.Duration
	key     crypto.Signer
	root    *x509.Certificate
	rootPEM []byte
	serving tls.Certificate
	log     hclog.Logger
}

// New generates a root key and certificate and a TLS serving certificate, and writes the root
// to o.RootFile when set.
func New(o Options) (*CA, error) {
	c := &CA{ttl: o.TTL, log: o.Log}
	if c.ttl <= 0 {
		c.ttl = 24 * time.Hour
	}
	if c.log == nil {
		c.log = hclog.NewNullLogger()
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "agentd devplane root CA", Organization: []string{"cluster.local"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA root: %w", err)
	}
	if c.root, err = x509.ParseCertificate(der); err != nil {
		return nil, fmt.Errorf("parse CA root: %w", err)
	}
	c.key = key
	c.rootPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := c.makeServing(o.Hosts); err != nil {
		return nil, err
	}
	if o.RootFile != "" {
		if err := writeFile(o.RootFile, c.rootPEM); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *CA) makeServing(hosts []string) error {
	if len(hosts) == 0 {
		hosts = DefaultHosts
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate serving key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.root, key.Public(), c.key)
	if err != nil {
		return fmt.Errorf("create serving certificate: %w", err)
	}
	c.serving = tls.Certificate{Certificate: [][]byte{der, c.root.Raw}, PrivateKey: key}
	return nil
}

// RootPEM is the root certificate in PEM.
func (c *CA) RootPEM() []byte { return c.rootPEM }

// Root is the root certificate.
func (c *CA) Root() *x509.Certificate { return c.root }

// Issue signs a workload certificate for pub with the given URI SANs and validity, and
// returns it in PEM. Tests use it to build answers a CSR alone would not give.
func (c *CA) Issue(pub crypto.PublicKey, uris []*url.URL, notBefore, notAfter time.Time) (string, error) {
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		URIs:                  uris,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.root, pub, c.key)
	if err != nil {
		return "", fmt.Errorf("sign certificate: %w", err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), nil
}

// Sign signs a PEM CSR for ttl (capped at the CA's TTL; 0 means the CA's TTL) and returns the
// chain, leaf first and root last.
func (c *CA) Sign(csrPEM string, ttl time.Duration) ([]string, error) {
	blk, _ := pem.Decode([]byte(csrPEM))
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("CSR is not a PEM CERTIFICATE REQUEST")
	}
	csr, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("CSR signature: %w", err)
	}
	if len(csr.URIs) == 0 {
		return nil, errors.New("CSR carries no URI SAN (want a SPIFFE identity)")
	}
	if ttl <= 0 || ttl > c.ttl {
		ttl = c.ttl
	}
	now := time.Now()
	leaf, err := c.Issue(csr.PublicKey, csr.URIs, now.Add(-backdate), now.Add(ttl))
	if err != nil {
		return nil, err
	}
	c.log.Debug("issued certificate", "identity", csr.URIs[0].String(), "ttl", ttl)
	return []string{leaf, string(c.rootPEM)}, nil
}

// CreateCertificate implements IstioCertificateService.
func (c *CA) CreateCertificate(_ context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	chain, err := c.Sign(req.GetCsr(), time.Duration(req.GetValidityDuration())*time.Second)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &securityv1alpha1.IstioCertificateResponse{CertChain: chain}, nil
}

// Register adds the CA's IstioCertificateService to s.
func (c *CA) Register(s grpc.ServiceRegistrar) {
	securityv1alpha1.RegisterIstioCertificateServiceServer(s, c)
}

// ServerTLS is the TLS configuration of the CA's port: its serving certificate, chained to
// its root, and HTTP/2 by ALPN (so it also works as a plain tls.Listener under gRPC).
func (c *CA) ServerTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{c.serving}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
}

// Run serves the CA API over TLS on l until ctx ends, then stops gracefully.
func (c *CA) Run(ctx context.Context, l net.Listener) error {
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(c.ServerTLS())))
	c.Register(s)
	served, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			s.GracefulStop()
		case <-served:
		}
	}()
	err := s.Serve(l)
	close(served)
	<-done
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve CA on %s: %w", l.Addr(), err)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("read random serial: %v", err))
	}
	return n
}

// writeFile writes b to path atomically (temp file + rename), creating the directory.
func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory of %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}
