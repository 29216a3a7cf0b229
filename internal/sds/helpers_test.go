package sds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	spiffepeer "github.com/agentd/agentd/internal/testing/spiffe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/agentd/agentd/internal/caclient"
	"github.com/agentd/agentd/internal/testing/ca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Ways the test CA can misbehave.
const (
	caGood         = ""
	caShortChain   = "one certificate"
	caOtherKey     = "certificate for another key"
	caNotYetValid  = "not yet valid"
	caExpired      = "already expired"
	caForeignLeaf  = "leaf signed by another CA"
	caForeignChain = "chain of another CA"
)

// testCA is the real CA behind a server that misbehaves on demand and can be stopped and
// started again on the same address.
type testCA struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	ca, rogue *ca.CA
	mode      atomic.Value // string
	addr      string
	rootFile  string
	plaintext bool // serve without TLS (a CA on port 15010)
	calls     atomic.Int32
	lastMD    atomic.Pointer[metadata.MD]
	hold      chan struct{} // when set, calls wait until it is closed

	mu  sync.Mutex
	srv *grpc.Server
	wg  sync.WaitGroup
}

func startCA(t testing.TB) *testCA {
	t.Helper()
	return startCAOn(t, "127.0.0.1:0", false)
}

// startPlaintextCA serves a CA without TLS on port 15010 of a random loopback address (the
// port that makes Istio's agent skip TLS). Its root is written nowhere a client looks.
func startPlaintextCA(t testing.TB) *testCA {
	t.Helper()
	return startCAOn(t, fmt.Sprintf("127.%d.%d.%d:15010", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1), true)
}

func startCAOn(t testing.TB, addr string, plaintext bool) *testCA {
	t.Helper()
	dir := t.TempDir()
	c, err := ca.New(ca.Options{RootFile: filepath.Join(dir, "root-cert.pem"), TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCA{ca: c, rogue: rogue, rootFile: filepath.Join(dir, "root-cert.pem"), plaintext: plaintext}
	tc.mode.Store(caGood)
	tc.start(t, addr)
	t.Cleanup(tc.stop)
	return tc
}

func (tc *testCA) start(t testing.TB, addr string) {
	t.Helper()
	var l net.Listener
	var err error
	for range 50 { // the old socket of the same port may linger a moment
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listen for CA on %s: %v", addr, err)
	}
	tc.addr = l.Addr().String()
	var opts []grpc.ServerOption
	if !tc.plaintext {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc.ca.ServerTLS())))
	}
	s := grpc.NewServer(opts...)
	securityv1alpha1.RegisterIstioCertificateServiceServer(s, tc)
	tc.mu.Lock()
	tc.srv = s
	tc.mu.Unlock()
	tc.wg.Add(1)
	go func() { defer tc.wg.Done(); _ = s.Serve(l) }()
}

func (tc *testCA) stop() {
	tc.mu.Lock()
	s := tc.srv
	tc.srv = nil
	tc.mu.Unlock()
	if s != nil {
		s.Stop()
	}
	tc.wg.Wait()
}

func (tc *testCA) client(t testing.TB, onRetry func(error)) *caclient.Client {
	t.Helper()
	c, err := caclient.New(caclient.Options{Address: tc.addr, RootCertFile: tc.rootFile, OnRetry: onRetry})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (tc *testCA) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	tc.calls.Add(1)
	md, _ := metadata.FromIncomingContext(ctx)
	tc.lastMD.Store(&md)
	if tc.hold != nil {
		select {
		case <-tc.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	resp, err := tc.ca.CreateCertificate(ctx, req)
	mode := tc.mode.Load().(string)
	if err != nil || mode == caGood {
		return resp, err
	}
	leaf, _ := caclient.ParsePEMCerts([]byte(resp.CertChain[0]))
	uris := leaf[0].URIs
	now := time.Now()
	root := string(tc.ca.RootPEM())
	issue := func(c *ca.CA, pub any, nb, na time.Time) string {
		p, err := c.Issue(pub, uris, nb, na)
		if err != nil {
			panic(err)
		}
		return p
	}
	switch mode {
	case caShortChain:
		resp.CertChain = resp.CertChain[:1]
	case caOtherKey:
		_, _, other, _ := caclient.NewCSR(caclient.KeyOptions{ECCSignatureAlgorithm: "ECDSA"}, uris[0].String())
		resp.CertChain = []string{issue(tc.ca, other.Public(), now, now.Add(time.Hour)), root}
	case caNotYetValid:
		resp.CertChain = []string{issue(tc.ca, leaf[0].PublicKey, now.Add(time.Hour), now.Add(2*time.Hour)), root}
	case caExpired:
		resp.CertChain = []string{issue(tc.ca, leaf[0].PublicKey, now.Add(-2*time.Hour), now.Add(-time.Hour)), root}
	case caForeignLeaf:
		resp.CertChain = []string{issue(tc.rogue, leaf[0].PublicKey, now, now.Add(time.Hour)), root}
	case caForeignChain:
		resp.CertChain = []string{issue(tc.rogue, leaf[0].PublicKey, now, now.Add(time.Hour)), string(tc.rogue.RootPEM())}
	}
	return resp, nil
}

// sdsUnderTest is a running Server on a temp Unix socket.
type sdsUnderTest struct {
	*Server
	sock string
	reg  *prometheus.Registry
}

func startSDS(t testing.TB, o Options) *sdsUnderTest {
	t.Helper()
	dir, err := os.MkdirTemp("", "sds") // short: Unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "socket")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	o.Metrics = reg
	if o.Log == nil {
		o.Log = hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn, Output: testWriter{t}})
	}
	s, err := NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	eventually(t, "the server to serve", func() bool { return s.Ready() == nil })
	return &sdsUnderTest{Server: s, sock: sock, reg: reg}
}

// withCA is the Options of a server using tc as its CA, with ECDSA keys (fast).
func withCA(t testing.TB, tc *testCA, s **sdsUnderTest, id string, ttl time.Duration) Options {
	return Options{
		CA: tc.client(t, func(err error) {
			if *s != nil {
				(*s).OnRetry(err)
			}
		}),
		Identity:  id,
		Key:       caclient.KeyOptions{ECCSignatureAlgorithm: "ECDSA"},
		SecretTTL: ttl,
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// metric returns the value of the counter or gauge name (summed over its series).
func (s *sdsUnderTest) metric(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var v float64
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		return v
	}
	// Not served: a family Istio serves from its first record on (failures, retries) has
	// none yet. A misspelt name never grows, so the tests waiting for it fail.
	return 0
}

// eventually polls cond every 20ms until it holds or 30s have passed.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dial(t testing.TB, sock string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// sotw is an SDS SotW client stream, as Envoy opens one per resource.
type sotw struct {
	t      testing.TB
	stream secretv3.SecretDiscoveryService_StreamSecretsClient
	names  []string
	cancel context.CancelFunc
}

func watch(t testing.TB, conn *grpc.ClientConn, names ...string) *sotw {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	st, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &sotw{t: t, stream: st, names: names, cancel: cancel}
	t.Cleanup(cancel)
	c.send("", "")
	return c
}

func (c *sotw) send(version, nonce string) {
	err := c.stream.Send(&discoveryv3.DiscoveryRequest{
		Node: &corev3.Node{Id: "sidecar~127.0.0.1~test.ns~ns.svc.cluster.local"}, TypeUrl: resourcev3.SecretType,
		ResourceNames: c.names, VersionInfo: version, ResponseNonce: nonce,
	})
	if err != nil && !errors.Is(err, io.EOF) {
		c.t.Fatalf("send SDS request: %v", err)
	}
}

// next receives the next response, ACKs it and returns its secrets by name.
func (c *sotw) next() (map[string]*tlsv3.Secret, error) {
	resp, err := c.stream.Recv()
	if err != nil {
		return nil, err
	}
	out := map[string]*tlsv3.Secret{}
	for _, a := range resp.GetResources() {
		s := &tlsv3.Secret{}
		if err := a.UnmarshalTo(s); err != nil {
			c.t.Fatalf("decode secret: %v", err)
		}
		out[s.GetName()] = s
	}
	c.send(resp.GetVersionInfo(), resp.GetNonce())
	return out, nil
}

func (c *sotw) mustNext() map[string]*tlsv3.Secret {
	c.t.Helper()
	m, err := c.next()
	if err != nil {
		c.t.Fatalf("receive SDS response: %v", err)
	}
	return m
}

// until receives until the secret name satisfies cond and returns it.
func (c *sotw) until(name string, cond func(*tlsv3.Secret) bool) *tlsv3.Secret {
	c.t.Helper()
	for {
		m := c.mustNext()
		if s, ok := m[name]; ok && cond(s) {
			return s
		}
	}
}

// fetch opens a new stream for one resource and returns the first answer (or its error).
func fetch(t testing.TB, conn *grpc.ClientConn, name string) (*tlsv3.Secret, error) {
	t.Helper()
	c := watch(t, conn, name)
	defer c.cancel()
	m, err := c.next()
	if err != nil {
		return nil, err
	}
	if s, ok := m[name]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("response without %s", name)
}

func leaf(t testing.TB, s *tlsv3.Secret) *x509.Certificate {
	t.Helper()
	certs, err := caclient.ParsePEMCerts(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	if err != nil {
		t.Fatal(err)
	}
	return certs[0]
}

func serial(t testing.TB, s *tlsv3.Secret) string { return leaf(t, s).SerialNumber.String() }

func pair(t testing.TB, s *tlsv3.Secret) tls.Certificate {
	t.Helper()
	tc := s.GetTlsCertificate()
	c, err := tls.X509KeyPair(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
	if err != nil {
		t.Fatalf("secret %s is not a valid pair: %v", s.GetName(), err)
	}
	return c
}

func pool(t testing.TB, s *tlsv3.Secret) *x509.CertPool {
	t.Helper()
	certs, err := caclient.ParsePEMCerts(s.GetValidationContext().GetTrustedCa().GetInlineBytes())
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// mtlsServer is an echo server that presents the current certificate of its workload and
// requires a client certificate with the expected identity.
type mtlsServer struct {
	addr string
	cert atomic.Pointer[tls.Certificate]
	l    net.Listener
	wg   sync.WaitGroup
}

func startMTLS(t testing.TB, cert tls.Certificate, roots *x509.CertPool, clientID string) *mtlsServer {
	t.Helper()
	m := &mtlsServer{}
	m.cert.Store(&cert)
	cfg := &tls.Config{
		GetCertificate:   func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return m.cert.Load(), nil },
		ClientAuth:       tls.RequireAnyClientCert,
		VerifyConnection: spiffepeer.VerifyPeer(roots, clientID),
		MinVersion:       tls.VersionTLS13,
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.l, m.addr = l, l.Addr().String()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			m.wg.Add(1)
			go func() { defer m.wg.Done(); defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { l.Close(); m.wg.Wait() })
	return m
}

// dialMTLS connects to addr with cert, checking the server's identity, and checks an echo.
func dialMTLS(t testing.TB, addr string, cert tls.Certificate, roots *x509.CertPool, serverID string) *tls.Conn {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{
		Certificates:       []tls.Certificate{cert},
		InsecureSkipVerify: true, // SPIFFE certificates carry no host name: spiffepeer.VerifyPeer checks them
		VerifyConnection:   spiffepeer.VerifyPeer(roots, serverID),
		MinVersion:         tls.VersionTLS13,
	})
	if err != nil {
		t.Fatalf("mTLS handshake with %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	echo(t, c)
	return c
}

func echo(t testing.TB, c *tls.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatalf("write over TLS: %v", err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo over TLS = %q, %v", buf, err)
	}
}

func spiffe(ns, sa string) string { return caclient.SPIFFEID("cluster.local", ns, sa) }

func uriOf(t testing.TB, s *tlsv3.Secret) string {
	t.Helper()
	l := leaf(t, s)
	if len(l.URIs) != 1 {
		t.Fatalf("leaf URIs = %v", l.URIs)
	}
	return l.URIs[0].String()
}

func tlsDialErr(addr string, cert tls.Certificate, roots *x509.CertPool, serverID string) (*tls.Conn, error) {
	c, err := tls.Dial("tcp", addr, &tls.Config{
		Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true,
		VerifyConnection: spiffepeer.VerifyPeer(roots, serverID), MinVersion: tls.VersionTLS13,
	})
	if err == nil {
		c.Close()
	}
	return c, err
}
