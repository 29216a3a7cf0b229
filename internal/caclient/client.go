// Package caclient is a client of Istio's CA API (IstioCertificateService): it makes keys and
// CSRs as Istio's agent does, has them signed, and checks the answer.
package caclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
)

// Retry policy of Istio's CA client (pkg/security/retry.go): 5 attempts, exponential backoff
// from 100 ms with 10% jitter, on these codes.
const (
	maxAttempts    = 5
	initialBackoff = 100 * time.Millisecond
	backoffJitter  = 0.1
)

var retryable = map[codes.Code]bool{
	codes.Canceled: true, codes.DeadlineExceeded: true, codes.ResourceExhausted: true,
	codes.Aborted: true, codes.Internal: true, codes.Unavailable: true,
}

// Options configures a Client. Only Address is required.
type Options struct {
	// Address is the CA's host:port (CA_ADDR). One ending in ":15010" is dialled in
	// plaintext, any other over TLS.
	Address string
	// RootCertFile holds the PEM roots that verify the CA's TLS certificate (CA_ROOT_CA after
	// Istio's resolution); "" or "SYSTEM" means the system roots. It is read on every dial.
	RootCertFile string
	// ServerName is the name the CA's certificate must carry (ISTIOD_SAN); default the host of
	// Address, with "localhost" read as istiod.istio-system.svc as Istio does.
	ServerName string
	// TokenFile holds the bearer token (the istio-ca audience JWT), read on every call; a
	// missing or empty file sends no authorization header.
	TokenFile string
	// ClusterID is sent as the ClusterID header (ISTIO_META_CLUSTER_ID) exactly as given, ""
	// included: istiod maps an empty one to its own cluster, so there is no default here.
	ClusterID string
	// Headers are extra gRPC headers (CA_HEADER_<name>=value).
	Headers map[string]string
	// CertSigner is sent as the CertSigner request metadata (ISTIO_META_CERT_SIGNER); every
	// request carries it, "" included, as Istio's do.
	CertSigner string
	// OnRetry is called before each retry of a failed call (metrics).
	OnRetry func(err error)
}

// Client signs CSRs with an Istio CA. It is safe for concurrent use.
type Client struct {
	opts Options

	mu   sync.Mutex
	conn *grpc.ClientConn
}

// New returns a Client for o; it dials lazily, on the first Sign.
func New(o Options) (*Client, error) {
	if _, _, err := net.SplitHostPort(o.Address); err != nil {
		return nil, fmt.Errorf("CA address %q: %w", o.Address, err)
	}
	return &Client{opts: o}, nil
}

// Plaintext reports whether the CA at addr is dialled without TLS (Istio: port 15010).
func Plaintext(addr string) bool { return strings.HasSuffix(addr, ":15010") }

// Sign sends csrPEM to the CA asking for a certificate valid for ttl and returns the PEM
// chain it answers, leaf first. Failures are retried as Istio does; after a failed call the
// connection is rebuilt, so that a rotated CA root file is read again.
func (c *Client) Sign(ctx context.Context, csrPEM []byte, ttl time.Duration) ([]string, error) {
	req := &securityv1alpha1.IstioCertificateRequest{
		Csr: string(csrPEM), ValidityDuration: int64(ttl.Seconds()),
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"CertSigner": structpb.NewStringValue(c.opts.CertSigner)}},
	}
	var err error
	for attempt := range maxAttempts {
		if attempt > 0 {
			if c.opts.OnRetry != nil {
				c.opts.OnRetry(err)
			}
			if werr := sleep(ctx, backoff(attempt)); werr != nil {
				break
			}
		}
		var resp *securityv1alpha1.IstioCertificateResponse
		resp, err = c.call(ctx, req)
		if err == nil {
			return resp.GetCertChain(), nil
		}
		if !retryable[status.Code(err)] || ctx.Err() != nil {
			break
		}
	}
	c.reset()
	return nil, fmt.Errorf("CreateCertificate at %s: %w", c.opts.Address, err)
}

func (c *Client) call(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	md := metadata.Pairs("ClusterID", c.opts.ClusterID)
	for k, v := range c.opts.Headers {
		md.Append(k, v)
	}
	if tok, err := os.ReadFile(c.opts.TokenFile); err == nil && len(strings.TrimSpace(string(tok))) > 0 {
		md.Set("authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	return securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(metadata.NewOutgoingContext(ctx, md), req)
}

func (c *Client) connection() (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		return c.conn, nil
	}
	creds := insecure.NewCredentials()
	if !Plaintext(c.opts.Address) {
		cfg, err := c.tlsConfig()
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(c.opts.Address, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("dial CA %s: %w", c.opts.Address, err)
	}
	c.conn = conn
	return conn, nil
}

func (c *Client) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.opts.ServerName}
	if cfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(c.opts.Address)
		cfg.ServerName = host
		if host == "localhost" {
			cfg.ServerName = "istiod.istio-system.svc"
		}
	}
	if f := c.opts.RootCertFile; f != "" && f != "SYSTEM" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read CA root %s: %w", f, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA root %s holds no PEM certificate", f)
		}
	}
	return cfg, nil
}

func (c *Client) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
}

// Close closes the connection to the CA.
func (c *Client) Close() error {
	c.reset()
	return nil
}

// backoff is the wait before retry n (n >= 1): 100 ms doubling, ±10%.
func backoff(n int) time.Duration {
	d := initialBackoff << (n - 1)
	j := 1 + backoffJitter*(2*rand.Float64()-1) // #nosec G404 -- jitter only
	return time.Duration(float64(d) * j)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
