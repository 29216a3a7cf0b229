package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testing/spiffe"

	"github.com/agentd/agentd/internal/testing/logbuf"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/agentd/agentd/internal/caclient"
)

// sdsDevplane runs devplane with its CA over TLS, issuing certificates of at most certTTL.
// It returns the CA address, the CA root file and the xDS address.
func sdsDevplane(t *testing.T, certTTL time.Duration) (caAddr, rootFile, xdsAddr string) {
	t.Helper()
	dir := t.TempDir()
	services := filepath.Join(dir, "services.yaml")
	if err := os.WriteFile(services, []byte("services: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rootFile = filepath.Join(dir, "ca-root.pem")
	caAddr = "127.0.0.1:" + strconv.Itoa(freePort(t))
	xdsAddr = "127.0.0.1:" + strconv.Itoa(freePort(t))
	cmd := exec.Command(bin("devplane"), "--services", services, "--xds-address", xdsAddr, "--debug-address", "",
		"--ca-address", caAddr, "--ca-root-out", rootFile, "--cert-ttl", certTTL.String())
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("devplane output:\n%s", out)
		}
	})
	waitFor(t, "devplane's CA", func() bool {
		c, err := net.Dial("tcp", caAddr)
		if err == nil {
			c.Close()
		}
		_, ferr := os.Stat(rootFile)
		return err == nil && ferr == nil
	})
	return caAddr, rootFile, xdsAddr
}

// sdsAgentd runs `agentd run --disable-envoy` for workload ns/sa with devplane's CA.
func sdsAgentd(t *testing.T, caAddr, rootFile, xdsAddr, ns, sa string, env ...string) *Agentd {
	t.Helper()
	env = append([]string{"CA_ADDR=" + caAddr, "CA_ROOT_CA=" + rootFile, "POD_NAMESPACE=" + ns,
		"SERVICE_ACCOUNT=" + sa, "ECC_SIGNATURE_ALGORITHM=ECDSA"}, env...)
	return startAgentd(t, env, "--disable-envoy", "--discovery-address", xdsAddr)
}

func sdsSocket(a *Agentd) string {
	return filepath.Join(a.Root, "var/run/secrets/workload-spiffe-uds/socket")
}

// sdsStream is an SDS client stream on agentd's socket, as Envoy opens one per resource.
type sdsStream struct {
	t      *testing.T
	conn   *grpc.ClientConn
	stream secretv3.SecretDiscoveryService_StreamSecretsClient
	name   string
	cancel context.CancelFunc
}

func openSDS(t *testing.T, socket, name string) *sdsStream {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	s := &sdsStream{t: t, conn: conn, name: name, cancel: cancel}
	t.Cleanup(s.close)
	if s.stream, err = secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx); err != nil {
		t.Fatalf("open SDS stream on %s: %v", socket, err)
	}
	s.send("", "")
	return s
}

func (s *sdsStream) close() { s.cancel(); s.conn.Close() }

func (s *sdsStream) send(version, nonce string) {
	err := s.stream.Send(&discoveryv3.DiscoveryRequest{
		Node: &corev3.Node{Id: "sidecar~127.0.0.1~e2e.ns~ns.svc.cluster.local"}, TypeUrl: resourcev3.SecretType,
		ResourceNames: []string{s.name}, VersionInfo: version, ResponseNonce: nonce,
	})
	if err != nil && !errors.Is(err, io.EOF) {
		s.t.Fatalf("send SDS request: %v", err)
	}
}

// next returns the next version of the secret, ACKed.
func (s *sdsStream) next() *tlsv3.Secret {
	s.t.Helper()
	for {
		resp, err := s.stream.Recv()
		if err != nil {
			s.t.Fatalf("receive %s: %v", s.name, err)
		}
		s.send(resp.GetVersionInfo(), resp.GetNonce())
		for _, a := range resp.GetResources() {
			sec := &tlsv3.Secret{}
			if err := a.UnmarshalTo(sec); err != nil {
				s.t.Fatal(err)
			}
			if sec.GetName() == s.name {
				return sec
			}
		}
	}
}

// workloadCert is what a workload takes from its SDS socket: its pair and its roots.
type workloadCert struct {
	pair  tls.Certificate
	leaf  *x509.Certificate
	roots *x509.CertPool
}

func fetchWorkload(t *testing.T, a *Agentd) (*workloadCert, *sdsStream) {
	t.Helper()
	def := openSDS(t, sdsSocket(a), "default")
	w := certFromSecret(t, def.next())
	root := openSDS(t, sdsSocket(a), "ROOTCA")
	roots, err := caclient.ParsePEMCerts(root.next().GetValidationContext().GetTrustedCa().GetInlineBytes())
	root.close()
	if err != nil {
		t.Fatalf("ROOTCA: %v", err)
	}
	w.roots = x509.NewCertPool()
	for _, r := range roots {
		w.roots.AddCert(r)
	}
	return w, def
}

func certFromSecret(t *testing.T, s *tlsv3.Secret) *workloadCert {
	t.Helper()
	tc := s.GetTlsCertificate()
	pair, err := tls.X509KeyPair(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
	if err != nil {
		t.Fatalf("default is not a valid pair: %v", err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	return &workloadCert{pair: pair, leaf: leaf}
}

// echoServer is a workload serving mTLS with the certificate it holds now.
type echoServer struct {
	cert atomic.Pointer[tls.Certificate]
	addr string
}

func startEcho(t *testing.T, w *workloadCert, clientID string) *echoServer {
	t.Helper()
	e := &echoServer{}
	e.cert.Store(&w.pair)
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		GetCertificate:   func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return e.cert.Load(), nil },
		ClientAuth:       tls.RequireAnyClientCert,
		VerifyConnection: spiffe.VerifyPeer(w.roots, clientID),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.addr = l.Addr().String()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return e
}

func dialEcho(t *testing.T, addr string, w *workloadCert, serverID string) *tls.Conn {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{
		Certificates: []tls.Certificate{w.pair}, InsecureSkipVerify: true, // SPIFFE: checked by spiffe.VerifyPeer
		VerifyConnection: spiffe.VerifyPeer(w.roots, serverID),
	})
	if err != nil {
		t.Fatalf("mTLS handshake: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	ping(t, c)
	return c
}

func ping(t *testing.T, c *tls.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo = %q, %v", buf, err)
	}
}

// TestSDSEndToEnd: two `agentd run` workloads get default and ROOTCA from devplane's CA over
// their real SDS sockets, complete a mutual TLS handshake checking each other's SPIFFE
// identity, and see a few-second certificate rotated: pushed on the open stream, the
// connection opened before keeps working, new handshakes use the new certificate and the
// OUTPUT_CERTS files follow.
func TestSDSEndToEnd(t *testing.T) {
	caAddr, rootFile, xdsAddr := sdsDevplane(t, 6*time.Second)
	out := t.TempDir()
	client := sdsAgentd(t, caAddr, rootFile, xdsAddr, "ns-a", "client")
	server := sdsAgentd(t, caAddr, rootFile, xdsAddr, "ns-b", "server", "OUTPUT_CERTS="+out)
	client.WaitReady()
	server.WaitReady()
	clientID, serverID := caclient.SPIFFEID("cluster.local", "ns-a", "client"), caclient.SPIFFEID("cluster.local", "ns-b", "server")

	cw, _ := fetchWorkload(t, client)
	sw, sstream := fetchWorkload(t, server)
	if got := sw.leaf.URIs[0].String(); got != serverID {
		t.Fatalf("server identity = %s, want %s", got, serverID)
	}
	devRoot, _ := os.ReadFile(rootFile)
	if !sw.roots.Equal(poolOf(t, devRoot)) {
		t.Error("ROOTCA is not devplane's root")
	}

	echo := startEcho(t, sw, clientID)
	old := dialEcho(t, echo.addr, cw, serverID)

	rotated := certFromSecret(t, sstream.next())
	for rotated.leaf.SerialNumber.Cmp(sw.leaf.SerialNumber) == 0 {
		rotated = certFromSecret(t, sstream.next())
	}
	waitFor(t, "OUTPUT_CERTS to hold the rotated certificate", func() bool {
		b, err := os.ReadFile(filepath.Join(out, "cert-chain.pem"))
		if err != nil {
			return false
		}
		certs, err := caclient.ParsePEMCerts(b)
		return err == nil && certs[0].SerialNumber.Cmp(rotated.leaf.SerialNumber) == 0
	})
	if fi, err := os.Stat(filepath.Join(out, "key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("OUTPUT_CERTS key.pem: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	echo.cert.Store(&rotated.pair) // what Envoy does with the pushed secret
	ping(t, old)                   // opened before the rotation, still works
	c := dialEcho(t, echo.addr, cw, serverID)
	if got := c.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(rotated.leaf.SerialNumber) != 0 {
		t.Errorf("a new handshake saw serial %s, want the rotated %s", got, rotated.leaf.SerialNumber)
	}
}

// TestSDSKill9: after a kill -9 of sds-server, a client that reconnects on the same socket
// gets a valid certificate from the restarted one.
func TestSDSKill9(t *testing.T) {
	caAddr, rootFile, xdsAddr := sdsDevplane(t, time.Hour)
	a := sdsAgentd(t, caAddr, rootFile, xdsAddr, "ns1", "sa1")
	before := childPids(t, a.WaitReady())["sds-server"]
	first, stream := fetchWorkload(t, a)
	stream.close()

	if err := syscall.Kill(before, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Connect at once: the socket is agentd's, so the connection waits for the next process.
	def := openSDS(t, sdsSocket(a), "default")
	w := certFromSecret(t, def.next())
	devRoot, _ := os.ReadFile(rootFile)
	if _, err := w.leaf.Verify(x509.VerifyOptions{Roots: poolOf(t, devRoot), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("certificate after the restart: %v", err)
	}
	if w.leaf.URIs[0].String() != caclient.SPIFFEID("cluster.local", "ns1", "sa1") || time.Now().After(w.leaf.NotAfter) {
		t.Errorf("certificate after the restart: identity %v, expires %v", w.leaf.URIs, w.leaf.NotAfter)
	}
	if w.leaf.SerialNumber.Cmp(first.leaf.SerialNumber) == 0 {
		t.Error("the restarted sds-server served the old certificate: it holds keys in memory only, so it cannot")
	}
	if after := childPids(t, a.WaitReady())["sds-server"]; after == before || after == 0 {
		t.Errorf("sds-server pid after kill -9 = %d, want a new process (was %d)", after, before)
	}
}

func poolOf(t *testing.T, pemBytes []byte) *x509.CertPool {
	t.Helper()
	certs, err := caclient.ParsePEMCerts(pemBytes)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}
