package xdsproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Upstream is how xds-proxy reaches the control plane, as istio-agent does.
type Upstream struct {
	Address   string            // ProxyConfig discoveryAddress, host:port
	ClusterID string            // sent as the ClusterID header (ISTIO_META_CLUSTER_ID)
	Headers   map[string]string // more headers (XDS_HEADER_<name>=value)
	// TLS is false only for controlPlaneAuthPolicy NONE.
	TLS bool
	// RootCert is the PEM file of the roots the server is checked against, read for every
	// new connection; "" means the system roots.
	RootCert string
	// SAN (ISTIOD_SAN) is the name the server certificate must carry; by default the host of
	// Address, with any "localhost" replaced by istiod.istio-system.svc.
	SAN string
	// CertChain and Key are a client certificate (PROV_CERT, file-mounted certs), presented
	// while it has not expired.
	CertChain, Key string
	// TokenPath is the JWT file sent as "authorization: Bearer", read for every stream; a
	// missing file sends no header.
	TokenPath string
}

// Istio's client settings towards istiod.
const (
	keepaliveTime     = 30 * time.Second
	keepaliveTimeout  = 10 * time.Second
	initialWindowSize = 1 << 20
)

// dialOptions builds the options of one upstream connection; the root file is read now, so
// a rotated root applies to the next connection.
func (u *Upstream) dialOptions(log hclog.Logger) ([]grpc.DialOption, error) {
	creds := insecure.NewCredentials()
	if u.TLS {
		cfg, err := u.tlsConfig(log)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.WithInitialWindowSize(initialWindowSize),
		grpc.WithInitialConnWindowSize(initialWindowSize),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)),
	}
	if u.TokenPath != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(tokenFile{path: u.TokenPath, log: log}))
	}
	return opts, nil
}

// outgoing adds the ClusterID and extra headers to ctx.
func (u *Upstream) outgoing(ctx context.Context) context.Context {
	kv := []string{"ClusterID", u.ClusterID}
	for k, v := range u.Headers {
		kv = append(kv, k, v)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

func (u *Upstream) tlsConfig(log hclog.Logger) (*tls.Config, error) {
	roots, err := x509.SystemCertPool()
	if u.RootCert != "" {
		roots, err = loadRoots(u.RootCert)
	}
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, ServerName: u.serverName()}
	if u.CertChain != "" && u.Key != "" {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return u.clientCert(log)
		}
	}
	return cfg, nil
}

func (u *Upstream) serverName() string {
	if u.SAN != "" {
		return u.SAN
	}
	host, _, err := net.SplitHostPort(u.Address)
	if err != nil {
		host = u.Address
	}
	if strings.Contains(host, "localhost") { // a port-forward to istiod
		return "istiod.istio-system.svc"
	}
	return host
}

func loadRoots(path string) (*x509.CertPool, error) {
	pemData, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read xDS root certificates: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("xDS root certificates %s: no certificate found", path)
	}
	return pool, nil
}

// clientCert loads the client certificate; an expired or unreadable one is not presented
// (the token may still authenticate), as Istio does.
func (u *Upstream) clientCert(log hclog.Logger) (*tls.Certificate, error) {
	chain, err := os.ReadFile(u.CertChain)
	if err == nil {
		var expired bool
		if expired, err = certExpired(chain); err == nil && expired {
			err = errors.New("certificate expired")
		}
	}
	if err != nil {
		log.Warn("not presenting the xDS client certificate, using the token instead", "error", err)
		return &tls.Certificate{}, nil
	}
	cert, err := tls.LoadX509KeyPair(u.CertChain, u.Key)
	if err != nil {
		return nil, fmt.Errorf("load xDS client certificate: %w", err)
	}
	return &cert, nil
}

func certExpired(chainPEM []byte) (bool, error) {
	block, _ := pem.Decode(chainPEM)
	if block == nil {
		return false, errors.New("no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return false, fmt.Errorf("parse certificate: %w", err)
	}
	return time.Now().After(cert.NotAfter), nil
}

// tokenFile sends the JWT of a file with every RPC, read fresh each time (it rotates).
type tokenFile struct {
	path string
	log  hclog.Logger
}

func (t tokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := os.ReadFile(t.path)
	if err != nil {
		t.log.Warn("no xDS token", "error", err)
		return nil, nil
	}
	if s := strings.TrimSpace(string(tok)); s != "" {
		return map[string]string{"authorization": "Bearer " + s}, nil
	}
	return nil, nil
}

// RequireTransportSecurity is false: istiod on a plaintext port may still want the token.
func (tokenFile) RequireTransportSecurity() bool { return false }

// expectedEnd reports whether err is how a stream normally ends: a client going away, a
// control plane restarting, a deadline.
func expectedEnd(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		return true
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.Canceled, codes.DeadlineExceeded:
			return true
		case codes.Unavailable:
			for _, m := range []string{"client disconnected", "error reading from server: EOF", "transport is closing"} {
				if strings.Contains(s.Message(), m) {
					return true
				}
			}
		}
	}
	msg := err.Error()
	return strings.Contains(msg, "stream terminated by RST_STREAM with error code: NO_ERROR") ||
		strings.Contains(msg, "received prior goaway: code: NO_ERROR")
}
