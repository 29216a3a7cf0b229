package sds

import (
	"context"
	"fmt"
	"net"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/errgroup"

	"github.com/agentd/agentd/internal/caclient"
	"github.com/agentd/agentd/internal/component"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// Helper is sds-server as an agentd helper: the SDS server on the inherited socket, with
// the PCDS trust bundle from the bus.
type Helper struct {
	srv *Server
	l   net.Listener
	bus *component.Bus
	log hclog.Logger
}

// New builds sds-server from its environment: SDSConfig, the inherited socket and the bus.
func New(env *component.Env) (component.Helper, error) {
	var c agentv1.SDSConfig
	if err := env.UnmarshalConfig(&c); err != nil {
		return nil, err
	}
	socket := agentv1.SocketSDSWorkload
	if c.GetFilesOnly() {
		socket = agentv1.SocketSDSFiles
	}
	// Envoy, agentd's child, runs as agentd's user: nobody else gets the workload's key,
	// whatever the socket's mode (0666, as Istio's).
	l, err := env.OwnerListener(socket)
	if err != nil {
		return nil, err
	}
	o, err := configFrom(&c, env.Root)
	if err != nil {
		return nil, err
	}
	o.Log, o.Metrics = env.Log, env.Metrics
	var srv *Server
	if c.GetCaAddress() != "" && !c.GetFilesOnly() {
		if o.CA, err = CAClient(&c, env.Root, func(err error) { srv.OnRetry(err) }); err != nil {
			return nil, err
		}
	}
	if srv, err = NewServer(o); err != nil {
		return nil, err
	}
	return &Helper{srv: srv, l: l, bus: env.Bus, log: env.Log}, nil
}

// CAClient is the CA client of the helper's configuration. What the configuration holds is
// sent as it is (an empty cluster ID included: istiod maps it to its own cluster); whether a
// CA root file is needed is the client's rule (none for plaintext on port 15010).
func CAClient(c *agentv1.SDSConfig, root string, onRetry func(error)) (*caclient.Client, error) {
	return caclient.New(caclient.Options{
		Address:      c.GetCaAddress(),
		RootCertFile: abs(root, c.GetCaRootCert()),
		ServerName:   c.GetCaServerName(),
		TokenFile:    abs(root, c.GetTokenFile()),
		ClusterID:    c.GetClusterId(),
		Headers:      c.GetCaHeaders(),
		CertSigner:   c.GetCertSigner(),
		OnRetry:      onRetry,
	})
}

// configFrom turns the helper's configuration into the server's (without the CA client). agentd
// sends complete configurations (its settings table holds Istio's defaults): nothing is
// defaulted here but the identity of a pod without a namespace or service account.
func configFrom(c *agentv1.SDSConfig, root string) (Options, error) {
	o := Options{
		Identity: caclient.SPIFFEID(c.GetTrustDomain(),
			orDefault(c.GetPodNamespace(), "default"), orDefault(c.GetServiceAccount(), "default")),
		Key: caclient.KeyOptions{
			RSAKeySize: int(c.GetRsaKeySize()), ECCSignatureAlgorithm: c.GetEccSignatureAlgorithm(),
			ECCCurve: c.GetEccCurve(), PKCS8: c.GetPkcs8Key(),
		},
		SecretTTL:     c.GetSecretTtl().AsDuration(),
		GraceRatio:    c.GetGracePeriodRatio(),
		GraceJitter:   c.GetGracePeriodRatioJitter(),
		OutputDir:     c.GetOutputCerts(),
		CertChainFile: c.GetCertChainFile(),
		KeyFile:       c.GetKeyFile(),
		RootCertFile:  c.GetRootCertFile(),
		FilesOnly:     c.GetFilesOnly(),
		FileDebounce:  c.GetFileDebounce().AsDuration(),
		Root:          root,
	}
	if o.GraceRatio < 0 || o.GraceRatio > 1 {
		return Options{}, fmt.Errorf("SECRET_GRACE_PERIOD_RATIO %v: want a value in [0, 1]", o.GraceRatio)
	}
	if c.GetOutputWorldReadable() {
		o.OutputMode = 0o644
	}
	if err := o.Key.Validate(); err != nil {
		return Options{}, err
	}
	return o, nil
}

// Run serves until ctx ends.
func (h *Helper) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return h.srv.Run(ctx, h.l) })
	if h.bus != nil {
		g.Go(func() error { h.subscribe(ctx); return nil })
	}
	return g.Wait()
}

// subscribe feeds the PCDS trust bundle published on the bus to the server.
func (h *Helper) subscribe(ctx context.Context) {
	h.bus.Follow(ctx, agentv1.TopicTrustBundle, h.log, func(m *agentv1.BusMessage) {
		var tb agentv1.TrustBundle
		if err := m.GetPayload().UnmarshalTo(&tb); err != nil {
			h.log.Warn("bad trust bundle on the bus", "error", err)
			return
		}
		h.srv.SetTrustBundle(tb.GetCaCertificatesPem())
	})
}

// Ready returns nil once the server serves its socket; it does not wait for a certificate.
func (h *Helper) Ready() error { return h.srv.Ready() }

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// abs puts a relative path under root ("SYSTEM" is a keyword, not a path).
func abs(root, p string) string {
	if p == "" || p == "SYSTEM" || root == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(root, p)
}
