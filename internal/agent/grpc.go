package agent

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentd/agentd/internal/grpcbootstrap"
	"github.com/agentd/agentd/internal/settings"
)

// grpcBootstrapOptions is Istio's gRPC xDS bootstrap for proxyless clients: xds-proxy's
// socket, the node Envoy would be (with GENERATOR grpc), and OUTPUT_CERTS as its
// file_watcher certificates.
func grpcBootstrapOptions(s *settings.Settings) (grpcbootstrap.Options, error) {
	node, err := bootstrapConfig(s).GRPCNode()
	if err != nil {
		return grpcbootstrap.Options{}, fmt.Errorf("gRPC bootstrap: %w", err)
	}
	uri, err := grpcbootstrap.SocketURI(s.Path(settings.XDSSocket))
	if err != nil {
		return grpcbootstrap.Options{}, err
	}
	opts := grpcbootstrap.Options{ServerURI: uri, NodeID: node.GetId(), Metadata: node.GetMetadata().AsMap()}
	if l := node.GetLocality(); l != nil {
		opts.Locality = &grpcbootstrap.Locality{Region: l.GetRegion(), Zone: l.GetZone(), SubZone: l.GetSubZone()}
	}
	if s.Env.OutputCerts != "" {
		opts.CertDir = s.Path(s.Env.OutputCerts)
	}
	return opts, nil
}

// writeGRPCBootstrap writes the gRPC xDS bootstrap to GRPC_XDS_BOOTSTRAP on every start, as
// pilot-agent does: a proxyless gRPC application that reads it resolves xds:/// targets
// through xds-proxy's socket.
func (a *Agent) writeGRPCBootstrap() error {
	opts, err := grpcBootstrapOptions(a.s)
	if err != nil {
		return err
	}
	path := grpcBootstrapPath(a.s)
	if err := grpcbootstrap.WriteFile(path, opts); err != nil {
		return err
	}
	a.log.Info("wrote the gRPC xDS bootstrap", "path", path, "node", opts.NodeID)
	a.grpcBootstrap, a.grpcCertDir = path, opts.CertDir
	return nil
}

// grpcReady is Istio's readiness condition for proxyless clients: the gRPC bootstrap exists
// and, when it names file_watcher certificates, so do they.
func (a *Agent) grpcReady() error {
	if a.grpcBootstrap == "" {
		return nil
	}
	paths := []string{a.grpcBootstrap}
	if a.grpcCertDir != "" {
		paths = append(paths, filepath.Join(a.grpcCertDir, "cert-chain.pem"), filepath.Join(a.grpcCertDir, "key.pem"))
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("gRPC xDS bootstrap not ready: %w", err)
		}
	}
	return nil
}
