package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	meshv1 "istio.io/api/mesh/v1alpha1"

	"github.com/agentd/agentd/internal/envoy"
	"github.com/agentd/agentd/internal/grpcbootstrap"
	"github.com/agentd/agentd/internal/sds"
	"github.com/agentd/agentd/internal/supervisor"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// Istio's xDS paths, relative to the root.
const (
	xdsSocket = "etc/istio/proxy/XDS"
	// defaultGRPCBootstrap is GRPC_XDS_BOOTSTRAP's default.
	defaultGRPCBootstrap = "etc/istio/proxy/grpc-bootstrap.json"
	// plaintextPort is istiod's plaintext xDS port: agentd never speaks TLS to it.
	plaintextPort = "15010"
)

// xdsProxy is the xds-proxy child, set up as Istio's agent sets up its xDS proxy: the XDS
// socket, the discovery address, ClusterID and XDS_HEADER_* headers, TLS with Istio's xDS
// root (XDS_ROOT_CA, ...), ISTIOD_SAN, a PROV_CERT or file-mounted client certificate, the
// istio-token, NDS when DNS capture is on and PCDS with PROXY_CONFIG_XDS_AGENT. TLS follows
// PROXY_CONFIG's controlPlaneAuthPolicy, except towards port 15010, istiod's plaintext port.
// A missing xDS root does not stop xds-proxy (it stops Istio): its upstream streams fail
// until the file appears.
func (a *Agent) xdsProxy() (*supervisor.Child, error) {
	ecfg, _, err := a.envoyConfig() // the merged ProxyConfig and the node, as Envoy gets them
	if err != nil {
		return nil, fmt.Errorf("xds-proxy: %w", err)
	}
	cfg, err := a.xdsProxyConfig(ecfg.ProxyConfig)
	if err != nil {
		return nil, err
	}
	if err := a.writeGRPCBootstrap(ecfg); err != nil {
		return nil, err
	}
	return a.helper("xds-proxy", cfg, supervisor.Socket{
		Name: agentv1.SocketXDS, Network: "unix", Address: xdsSocket, Mode: 0o666,
	}), nil
}

func (a *Agent) xdsProxyConfig(pc *meshv1.ProxyConfig) (*agentv1.XDSProxyConfig, error) {
	env := a.opts.getenv
	cfg := &agentv1.XDSProxyConfig{
		DiscoveryAddress: a.opts.DiscoveryAddress,
		ClusterId:        firstNonEmpty(env("ISTIO_META_CLUSTER_ID"), env("CLUSTER_ID"), "Kubernetes"),
		Headers:          envPrefixed(a.opts.Env, "XDS_HEADER_"),
		IstiodSan:        env("ISTIOD_SAN"),
		TokenPath:        a.rootedPath(sds.DefaultTokenFile),
		NameTable:        a.dnsOn(),
		ProxyConfig:      envTrue(env("PROXY_CONFIG_XDS_AGENT")),
	}
	if cfg.DiscoveryAddress == "" {
		cfg.DiscoveryAddress = pc.GetDiscoveryAddress()
	}
	_, port, _ := net.SplitHostPort(cfg.DiscoveryAddress)
	cfg.Tls = pc.GetControlPlaneAuthPolicy() != meshv1.AuthenticationPolicy_NONE && port != plaintextPort
	if !cfg.Tls {
		return cfg, nil
	}
	var err error
	if cfg.RootCert, err = a.xdsRoot(); err != nil {
		return nil, err
	}
	switch {
	case env("PROV_CERT") != "":
		cfg.CertChain = a.rootedPath(filepath.Join(env("PROV_CERT"), "cert-chain.pem"))
		cfg.Key = a.rootedPath(filepath.Join(env("PROV_CERT"), "key.pem"))
	case envTrue(env("FILE_MOUNTED_CERTS")):
		if c, k := env("ISTIO_META_TLS_CLIENT_CERT_CHAIN"), env("ISTIO_META_TLS_CLIENT_KEY"); c != "" && k != "" {
			cfg.CertChain, cfg.Key = a.rootedPath(c), a.rootedPath(k)
		}
	}
	return cfg, nil
}

// xdsRoot is Istio's resolution of the roots that verify the control plane, an absolute
// path or "" for the system roots: XDS_ROOT_CA (SYSTEM or a path), etc/certs/root-cert.pem
// if it exists, PROV_CERT's root-cert.pem, the file-mounted ISTIO_META_TLS_CLIENT_ROOT_CERT,
// an error with PILOT_CERT_PROVIDER=none, else the istiod root of istio-ca-root-cert.
func (a *Agent) xdsRoot() (string, error) {
	env := a.opts.getenv
	legacy := filepath.Join(legacyCertDir, "root-cert.pem")
	switch {
	case env("XDS_ROOT_CA") == "SYSTEM":
		return "", nil
	case env("XDS_ROOT_CA") != "":
		return a.rootedPath(env("XDS_ROOT_CA")), nil
	case fileExists(a.rootedPath(legacy)):
		return a.rootedPath(legacy), nil
	case env("PROV_CERT") != "":
		return a.rootedPath(filepath.Join(env("PROV_CERT"), "root-cert.pem")), nil
	case envTrue(env("FILE_MOUNTED_CERTS")) && env("ISTIO_META_TLS_CLIENT_ROOT_CERT") != "":
		return a.rootedPath(env("ISTIO_META_TLS_CLIENT_ROOT_CERT")), nil
	case env("PILOT_CERT_PROVIDER") == "none":
		return "", errors.New("xDS root certificate: PILOT_CERT_PROVIDER=none and no XDS_ROOT_CA")
	}
	return a.rootedPath(istiodRootCert), nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// writeGRPCBootstrap writes Istio's gRPC xDS bootstrap to GRPC_XDS_BOOTSTRAP (default
// etc/istio/proxy/grpc-bootstrap.json) on every start, as pilot-agent does: a proxyless gRPC
// application that reads it resolves xds:/// targets through xds-proxy's socket, as the node
// Envoy would be (with GENERATOR grpc), with OUTPUT_CERTS as its file_watcher certificates.
func (a *Agent) writeGRPCBootstrap(ecfg *envoy.Config) error {
	env := a.opts.getenv
	node, err := ecfg.Node()
	if err != nil {
		return fmt.Errorf("gRPC bootstrap: %w", err)
	}
	uri, err := grpcbootstrap.SocketURI(a.rootedPath(xdsSocket))
	if err != nil {
		return err
	}
	opts := grpcbootstrap.Options{ServerURI: uri, NodeID: node.GetId(), Metadata: node.GetMetadata().AsMap()}
	if l := node.GetLocality(); l != nil {
		opts.Locality = &grpcbootstrap.Locality{Region: l.GetRegion(), Zone: l.GetZone(), SubZone: l.GetSubZone()}
	}
	if dir := env("OUTPUT_CERTS"); dir != "" {
		opts.CertDir = a.rootedPath(dir)
	}
	path := a.rootedPath(firstNonEmpty(env("GRPC_XDS_BOOTSTRAP"), defaultGRPCBootstrap))
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
