package sds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/agentd/agentd/internal/caclient"
)

// Options configures a Server. The zero value serves file resources only.
type Options struct {
	// CA signs workload certificates for "default"; nil means no CA (file-mounted
	// certificates, or files only when another SDS server owns the workload socket).
	CA Signer
	// Identity is the SPIFFE id asked for (caclient.SPIFFEID).
	Identity string
	// Key says what kind of key to make (WORKLOAD_RSA_KEY_SIZE, ECC_*, PKCS8_KEY).
	Key caclient.KeyOptions
	// SecretTTL is the lifetime asked for (SECRET_TTL); default 24h.
	SecretTTL time.Duration
	// GraceRatio (SECRET_GRACE_PERIOD_RATIO, default 0.5) and GraceJitter
	// (SECRET_GRACE_PERIOD_RATIO_JITTER, default 0.01) set when a certificate is rotated.
	GraceRatio, GraceJitter float64
	// OutputDir receives key.pem, cert-chain.pem and root-cert.pem on every change
	// (OUTPUT_CERTS); OutputMode is their mode, default 0600.
	OutputDir  string
	OutputMode os.FileMode
	// CertChainFile, KeyFile and RootCertFile, when the files exist and are not empty, serve
	// "default" and "ROOTCA" instead of the CA (etc/certs, workload-spiffe-credentials).
	CertChainFile, KeyFile, RootCertFile string
	// FilesOnly serves file-cert:/file-root: resources only (another SDS server owns the
	// workload socket).
	FilesOnly bool
	// SystemRootFile is what file-root:system serves; default the first OS bundle found.
	SystemRootFile string
	// Root is the directory relative paths are under; default the working directory.
	Root string
	// FileDebounce groups file events (FILE_DEBOUNCE_DURATION, default 100ms);
	// FileRetryTimeout is how long files are re-read until they form a valid pair
	// (default 10s).
	FileDebounce, FileRetryTimeout time.Duration
	// GenerateTimeout bounds how long a request waits for a secret (default 10s).
	GenerateTimeout time.Duration
	Log             hclog.Logger
	Metrics         prometheus.Registerer
}

// Server is an SDS server (SotW and delta) for Istio's resource names. It pushes a changed
// secret to every client that watches it.
type Server struct {
	o       Options
	log     hclog.Logger
	m       *metrics
	mgr     *manager // nil without a CA
	files   *watcher
	secrets *store      // what is served
	sds     *sdsService // the gRPC service (xds.go)

	serving atomic.Bool // Run serves the socket

	mu     sync.Mutex
	bundle []byte // PCDS trust bundle when there is no CA
}

// NewServer builds a Server from o.
func NewServer(o Options) (*Server, error) {
	if o.SecretTTL <= 0 {
		o.SecretTTL = 24 * time.Hour
	}
	if o.GraceRatio == 0 {
		o.GraceRatio = 0.5
	}
	if o.FileDebounce <= 0 {
		o.FileDebounce = 100 * time.Millisecond
	}
	if o.FileRetryTimeout <= 0 {
		o.FileRetryTimeout = 10 * time.Second
	}
	if o.GenerateTimeout <= 0 {
		o.GenerateTimeout = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = hclog.NewNullLogger()
	}
	if o.CA != nil && o.Identity == "" {
		return nil, errors.New("a CA needs an identity to ask for")
	}
	s := &Server{o: o, log: o.Log}
	if o.CA != nil && !o.FilesOnly {
		s.mgr = &manager{
			ca: o.CA, identity: o.Identity, key: o.Key, ttl: o.SecretTTL,
			graceRatio: o.GraceRatio, graceJitter: o.GraceJitter,
			out:    newOutput(s.abs(o.OutputDir), o.OutputMode, o.Metrics),
			log:    o.Log.Named("secrets"),
			notify: s.refresh, renewNow: make(chan struct{}, 1), first: make(chan struct{}),
		}
	}
	var expiry func() time.Time
	if s.mgr != nil {
		expiry = s.mgr.expiry
	} else {
		expiry = func() time.Time { return time.Time{} }
	}
	s.m = newMetrics(o.Metrics, expiry)
	if s.mgr != nil {
		s.mgr.m = s.m
	}
	s.files = newWatcher(o.FileDebounce, o.FileRetryTimeout, s.reloadFile, o.Log.Named("files"), s.m)
	s.secrets = newStore(time.Now().UTC().Format(time.RFC3339) + "/")
	s.sds = &sdsService{store: s.secrets, ensure: s.ensure, log: o.Log.Named("xds"), m: s.m}
	return s, nil
}

// OnRetry is the CA client's retry hook: it counts istio_agent_num_outgoing_retries.
func (s *Server) OnRetry(error) { s.m.retries.WithLabelValues(requestTypeCSR).Inc() }

// Run serves SDS on l, keeps the workload certificate and watches certificate files until
// ctx ends.
func (s *Server) Run(ctx context.Context, l net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// WaitForHandlers: Run returns once every stream has ended and released its watches.
	gs := grpc.NewServer(grpc.MaxConcurrentStreams(100000), grpc.WaitForHandlers(true))
	secretv3.RegisterSecretDiscoveryServiceServer(gs, s.sds)

	errc := make(chan error, 3)
	var wg sync.WaitGroup
	run := func(f func() error) {
		wg.Add(1)
		go func() { defer wg.Done(); errc <- f() }()
	}
	run(func() error { return s.files.Run(ctx) })
	if s.mgr != nil {
		run(func() error { return s.mgr.Run(ctx) })
	}
	s.serving.Store(true)
	defer s.serving.Store(false)
	run(func() error {
		if err := gs.Serve(l); err != nil {
			return fmt.Errorf("serve SDS on %s: %w", l.Addr(), err)
		}
		return nil
	})
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	gs.Stop()
	wg.Wait()
	return err
}

// Ready returns nil while the server serves its socket. As in Istio's agent, readiness does
// not wait for a workload certificate: Envoy starts at once, its first SDS request waits for
// the certificate (GenerateTimeout, then Envoy asks again), and the pod is ready when Envoy
// is, which needs its listeners' secrets. The certificate's state is in the logs and in
// istio_agent_cert_expiry_seconds.
func (s *Server) Ready() error {
	if !s.serving.Load() {
		return errors.New("not serving SDS yet")
	}
	return nil
}

// SetTrustBundle sets the extra trust roots (PCDS) that join ROOTCA.
func (s *Server) SetTrustBundle(pems []string) {
	b := mergeRoots([]byte(strings.Join(pems, "\n")))
	if s.mgr != nil {
		s.mgr.setTrustBundle(b)
		return
	}
	s.mu.Lock()
	s.bundle = b
	s.mu.Unlock()
	s.refresh(ResourceRootCA)
}

// ensure generates every named secret that is not served yet, waiting for it (at most
// GenerateTimeout, or until the stream's ctx ends) so that the request is answered at once. A
// secret that cannot be generated fails the stream, as Istio does; the client retries.
func (s *Server) ensure(ctx context.Context, names []string) error {
	for _, name := range names {
		if s.secrets.has(name) {
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, s.o.GenerateTimeout)
		sec, err := s.generate(gctx, name, true)
		cancel()
		if err != nil {
			s.log.Warn("cannot serve secret", "resource", name, "error", err)
			code := codes.Unavailable
			if errors.Is(err, errNoSource) {
				code = codes.InvalidArgument
			}
			return status.Errorf(code, "secret %q: %v", name, err)
		}
		s.publish(name, sec)
	}
	return nil
}

// refresh regenerates a secret that is being served and pushes it if it changed. It does not
// wait: a served secret's source already holds it.
func (s *Server) refresh(name string) {
	if !s.secrets.has(name) {
		return
	}
	sec, err := s.generate(context.Background(), name, false)
	if err != nil {
		s.log.Warn("cannot refresh secret; keeping the served one", "resource", name, "error", err)
		return
	}
	s.publish(name, sec)
}

// reloadFile is the watcher's reload: it fails while the files are not valid, so that the
// watcher retries and the old secret stays.
func (s *Server) reloadFile(name string) error {
	if !s.secrets.has(name) {
		return nil
	}
	sec, err := s.generate(context.Background(), name, false)
	if err != nil {
		return err
	}
	s.publish(name, sec)
	return nil
}

// publish serves sec as name and pushes it to the streams watching it, unless it is what
// they have.
func (s *Server) publish(name string, sec *tlsv3.Secret) {
	changed, err := s.secrets.set(name, sec)
	if err != nil {
		s.log.Error("pushing secret failed", "resource", name, "error", err)
		return
	}
	if changed {
		s.log.Debug("secret pushed", "resource", name)
	}
}

// generate builds the secret called name. retryFiles re-reads files until they are valid or
// FileRetryTimeout has passed (a first read may race a writer).
func (s *Server) generate(ctx context.Context, name string, retryFiles bool) (*tlsv3.Secret, error) {
	switch name {
	case ResourceDefault:
		if s.workloadFiles() {
			return s.filePair(ctx, name, s.abs(s.o.CertChainFile), s.abs(s.o.KeyFile), retryFiles)
		}
		if s.mgr == nil || s.o.FilesOnly {
			return nil, fmt.Errorf("%w: no CA and no certificate files", errNoSource)
		}
		w, err := s.mgr.workload(ctx)
		if err != nil {
			return nil, err
		}
		return certSecret(name, w.chain, w.key), nil
	case ResourceRootCA:
		if s.rootFile() {
			sec, err := s.fileRoots(ctx, name, s.abs(s.o.RootCertFile), retryFiles)
			if err != nil {
				return nil, err
			}
			vc := sec.GetValidationContext().GetTrustedCa()
			return rootSecret(name, mergeRoots(vc.GetInlineBytes(), s.trustBundle())), nil
		}
		if s.mgr == nil || s.o.FilesOnly {
			return nil, fmt.Errorf("%w: no CA and no root file", errNoSource)
		}
		roots, err := s.mgr.roots(ctx)
		if err != nil {
			return nil, err
		}
		return rootSecret(name, roots), nil
	case ResourceSystem:
		path := s.o.SystemRootFile
		if path == "" {
			path = systemBundle()
		}
		if path == "" {
			return nil, fmt.Errorf("%w: no OS trust bundle found", errNoSource)
		}
		return s.fileRoots(ctx, name, path, retryFiles)
	}
	f, ok := parseFileResource(name)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: want default, ROOTCA, file-cert:<cert>~<key>, file-root:<ca> or file-root:system", errNoSource)
	case f.root != "":
		return s.fileRoots(ctx, name, s.abs(f.root), retryFiles)
	}
	return s.filePair(ctx, name, s.abs(f.cert), s.abs(f.key), retryFiles)
}

func (s *Server) filePair(ctx context.Context, name, cert, key string, retry bool) (*tlsv3.Secret, error) {
	s.files.add(name, cert, key)
	var sec *tlsv3.Secret
	err := s.readFiles(ctx, retry, func() error {
		chain, k, err := loadPair(cert, key)
		if err == nil {
			sec = certSecret(name, chain, k)
		}
		return err
	})
	return sec, err
}

func (s *Server) fileRoots(ctx context.Context, name, path string, retry bool) (*tlsv3.Secret, error) {
	s.files.add(name, path)
	var sec *tlsv3.Secret
	err := s.readFiles(ctx, retry, func() error {
		roots, err := loadRoots(path)
		if err == nil {
			sec = rootSecret(name, roots)
		}
		return err
	})
	return sec, err
}

// readFiles runs read until it succeeds; with retry, it tries again with backoff from the
// debounce duration for FileRetryTimeout, and counts a failure when it gives up.
func (s *Server) readFiles(ctx context.Context, retry bool, read func() error) error {
	err := read()
	if err == nil || !retry {
		return err // a watcher reload counts its failure when it gives up
	}
	deadline := time.Now().Add(s.o.FileRetryTimeout)
	for delay := s.o.FileDebounce; time.Now().Add(delay).Before(deadline); delay *= 2 {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			s.m.fileSecretFailures.WithLabelValues().Inc()
			return err
		case <-t.C:
		}
		if err = read(); err == nil {
			return nil
		}
	}
	s.m.fileSecretFailures.WithLabelValues().Inc()
	return err
}

// workloadFiles reports whether "default" comes from files: both exist and are not empty,
// and they are not this server's own OUTPUT_CERTS (it would never rotate).
func (s *Server) workloadFiles() bool {
	return s.o.CertChainFile != "" && s.o.KeyFile != "" && !s.isOutput(s.o.CertChainFile) &&
		nonEmpty(s.abs(s.o.CertChainFile)) && nonEmpty(s.abs(s.o.KeyFile))
}

func (s *Server) rootFile() bool {
	return s.o.RootCertFile != "" && !s.isOutput(s.o.RootCertFile) && nonEmpty(s.abs(s.o.RootCertFile))
}

func (s *Server) isOutput(file string) bool {
	return s.o.OutputDir != "" && filepath.Clean(filepath.Dir(s.abs(file))) == filepath.Clean(s.abs(s.o.OutputDir))
}

func (s *Server) trustBundle() []byte {
	if s.mgr != nil {
		return s.mgr.trustBundle()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bundle
}

func (s *Server) abs(p string) string { return abs(s.o.Root, p) }

func nonEmpty(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Size() > 0
}

func systemBundle() string {
	for _, p := range systemBundles {
		if nonEmpty(p) {
			return p
		}
	}
	return ""
}
