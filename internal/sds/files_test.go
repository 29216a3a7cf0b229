package sds

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/agentd/agentd/internal/testing/ca"
)

// keyPair is a certificate and key as files hold them.
type keyPair struct{ cert, key, root []byte }

func newPair(t testing.TB, c *ca.CA, id string) keyPair {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	u, _ := url.Parse(id)
	now := time.Now()
	cert, err := c.Issue(k.Public(), []*url.URL{u}, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalECPrivateKey(k)
	return keyPair{cert: []byte(cert), key: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), root: c.RootPEM()}
}

func write(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// kubeletPublish writes files the way the kubelet updates a Secret volume: a new
// timestamped directory, a "..data_tmp" symlink renamed over "..data", the old directory
// removed. The visible names are symlinks into ..data.
func kubeletPublish(t testing.TB, dir string, gen int, files map[string][]byte) {
	t.Helper()
	ts := filepath.Join(dir, "..2026_01_01_00_00_0"+string(rune('0'+gen)))
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		write(t, filepath.Join(ts, name), b)
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

func certOf(s *tlsv3.Secret) []byte {
	return s.GetTlsCertificate().GetCertificateChain().GetInlineBytes()
}
func rootsOf(s *tlsv3.Secret) []byte {
	return s.GetValidationContext().GetTrustedCa().GetInlineBytes()
}

// TestFileCertKubeletSwaps: a Secret-volume pair and root replaced twice through the
// kubelet's ..data symlink swap are each served (Istio's issue 59912 lost the second one).
func TestFileCertKubeletSwaps(t *testing.T) {
	c1, _ := ca.New(ca.Options{})
	dir := t.TempDir()
	s := startSDS(t, Options{FileDebounce: 20 * time.Millisecond})
	conn := dial(t, s.sock)
	pairs := []keyPair{newPair(t, c1, "spiffe://td/ns/a/sa/one"), newPair(t, c1, "spiffe://td/ns/a/sa/two"), newPair(t, c1, "spiffe://td/ns/a/sa/three")}
	roots := [][]byte{mustCA(t).RootPEM(), mustCA(t).RootPEM(), mustCA(t).RootPEM()}
	kubeletPublish(t, dir, 0, map[string][]byte{"tls.crt": pairs[0].cert, "tls.key": pairs[0].key, "ca.crt": roots[0]})

	certName := FileCertResource(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	rootName := FileRootResource(filepath.Join(dir, "ca.crt"))
	cw, rw := watch(t, conn, certName), watch(t, conn, rootName)
	if got := certOf(cw.mustNext()[certName]); !bytes.Equal(got, pairs[0].cert) {
		t.Fatal("first pair not served")
	}
	if got := rootsOf(rw.mustNext()[rootName]); !bytes.Equal(got, roots[0]) {
		t.Fatal("first root not served")
	}
	for gen := 1; gen <= 2; gen++ {
		kubeletPublish(t, dir, gen, map[string][]byte{"tls.crt": pairs[gen].cert, "tls.key": pairs[gen].key, "ca.crt": roots[gen]})
		cw.until(certName, func(x *tlsv3.Secret) bool { return bytes.Equal(certOf(x), pairs[gen].cert) })
		rw.until(rootName, func(x *tlsv3.Secret) bool { return bytes.Equal(rootsOf(x), roots[gen]) })
	}
}

// TestFileCertReplaced: plain files rewritten in place and replaced by rename are served.
func TestFileCertReplaced(t *testing.T) {
	c1 := mustCA(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	p := []keyPair{newPair(t, c1, "spiffe://td/a"), newPair(t, c1, "spiffe://td/b"), newPair(t, c1, "spiffe://td/c")}
	write(t, cert, p[0].cert)
	write(t, key, p[0].key)
	s := startSDS(t, Options{FileDebounce: 20 * time.Millisecond})
	name := FileCertResource(cert, key)
	w := watch(t, dial(t, s.sock), name)
	w.mustNext()

	// In place: key then cert, as a careful writer does.
	write(t, key, p[1].key)
	write(t, cert, p[1].cert)
	w.until(name, func(x *tlsv3.Secret) bool { return bytes.Equal(certOf(x), p[1].cert) })

	// By rename.
	write(t, cert+".new", p[2].cert)
	write(t, key+".new", p[2].key)
	os.Rename(key+".new", key)
	os.Rename(cert+".new", cert)
	got := w.until(name, func(x *tlsv3.Secret) bool { return bytes.Equal(certOf(x), p[2].cert) })
	pair(t, got)
}

// TestFileHalfWritten: a truncated certificate, then a certificate that does not match the
// key, are not served: the old pair stays until the pair is whole again.
func TestFileHalfWritten(t *testing.T) {
	c1 := mustCA(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	a, b := newPair(t, c1, "spiffe://td/a"), newPair(t, c1, "spiffe://td/b")
	write(t, cert, a.cert)
	write(t, key, a.key)
	s := startSDS(t, Options{FileDebounce: 20 * time.Millisecond, FileRetryTimeout: 300 * time.Millisecond})
	conn := dial(t, s.sock)
	name := FileCertResource(cert, key)
	w := watch(t, conn, name)
	w.mustNext()

	steps := []struct {
		what string
		file string
		b    []byte
	}{
		{"truncated certificate", cert, b.cert[:len(b.cert)/2]},
		{"certificate of another key", cert, b.cert},
	}
	for _, st := range steps {
		failures := s.metric(t, "istio_agent_num_file_secret_failures_total")
		write(t, st.file, st.b)
		eventually(t, "the "+st.what+" to be given up on", func() bool {
			return s.metric(t, "istio_agent_num_file_secret_failures_total") > failures
		})
		got, err := fetch(t, conn, name)
		if err != nil || !bytes.Equal(certOf(got), a.cert) {
			t.Fatalf("after a %s: served %v, %v; want the old pair", st.what, got, err)
		}
	}
	write(t, key, b.key)
	w.until(name, func(x *tlsv3.Secret) bool { return bytes.Equal(certOf(x), b.cert) })
}

// TestFileMountedWorkload: with certificate files and no CA (FILE_MOUNTED_CERTS), default and
// ROOTCA come from the files and follow them.
func TestFileMountedWorkload(t *testing.T) {
	c1 := mustCA(t)
	dir := t.TempDir()
	o := Options{
		CertChainFile: "certs/cert-chain.pem", KeyFile: "certs/key.pem", RootCertFile: "certs/root-cert.pem",
		Root: dir, FileDebounce: 20 * time.Millisecond,
	}
	os.Mkdir(filepath.Join(dir, "certs"), 0o755)
	a, b := newPair(t, c1, "spiffe://td/a"), newPair(t, c1, "spiffe://td/b")
	write(t, filepath.Join(dir, o.KeyFile), a.key)
	write(t, filepath.Join(dir, o.CertChainFile), a.cert)
	write(t, filepath.Join(dir, o.RootCertFile), a.root)
	s := startSDS(t, o)
	if err := s.Ready(); err != nil {
		t.Fatalf("Ready = %v, want nil with valid files", err)
	}
	conn := dial(t, s.sock)
	dw := watch(t, conn, ResourceDefault)
	if !bytes.Equal(certOf(dw.mustNext()[ResourceDefault]), a.cert) {
		t.Fatal("default is not the file pair")
	}
	root, err := fetch(t, conn, ResourceRootCA)
	if err != nil || !bytes.Equal(rootsOf(root), c1.RootPEM()) {
		t.Fatalf("ROOTCA = %v, %v; want the root file", root, err)
	}
	write(t, filepath.Join(dir, o.KeyFile), b.key)
	write(t, filepath.Join(dir, o.CertChainFile), b.cert)
	dw.until(ResourceDefault, func(x *tlsv3.Secret) bool { return bytes.Equal(certOf(x), b.cert) })
}

// TestFilesOnly: when another SDS server owns the workload socket, only file resources are
// served, and default is refused.
func TestFilesOnly(t *testing.T) {
	c1 := mustCA(t)
	dir := t.TempDir()
	sys := filepath.Join(dir, "system.pem")
	write(t, sys, c1.RootPEM())
	s := startSDS(t, Options{FilesOnly: true, SystemRootFile: sys})
	conn := dial(t, s.sock)
	if _, err := fetch(t, conn, ResourceDefault); status.Code(err) != codes.InvalidArgument {
		t.Errorf("default in files-only mode: %v, want InvalidArgument", err)
	}
	got, err := fetch(t, conn, ResourceSystem)
	if err != nil || !bytes.Equal(rootsOf(got), c1.RootPEM()) {
		t.Errorf("file-root:system = %v, %v; want the system bundle", got, err)
	}
	if err := s.Ready(); err != nil {
		t.Errorf("Ready in files-only mode = %v, want nil", err)
	}
}

func mustCA(t testing.TB) *ca.CA {
	t.Helper()
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
