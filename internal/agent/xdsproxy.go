package agent

import (
	"cmp"
	"errors"
	"net"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"
	meshv1 "istio.io/api/mesh/v1alpha1"

	"github.com/agentd/agentd/internal/settings"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

const (
	// plaintextPort is istiod's plaintext xDS port: agentd never speaks TLS to it.
	plaintextPort = "15010"
	// WasmCacheDir is where xds-proxy caches Wasm modules (Istio's /var/lib/istio/data).
	WasmCacheDir = "var/lib/istio/data"
)

// splitList is a comma-separated list without empty items.
func splitList(v string) []string {
	var out []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// xdsProxyConfig is xds-proxy's configuration, as Istio's agent sets up its xDS proxy: the
// discovery address, cluster ID and XDS_HEADER_* headers, TLS with Istio's xDS root,
// ISTIOD_SAN, a PROV_CERT or file-mounted client certificate, the istio-token, NDS when DNS
// capture is on and PCDS with PROXY_CONFIG_XDS_AGENT. TLS follows the ProxyConfig's
// controlPlaneAuthPolicy, except towards port 15010, istiod's plaintext port. A missing xDS
// root does not stop xds-proxy (it stops Istio): its upstream streams fail until the file
// appears.
func xdsProxyConfig(s *settings.Settings) (*agentv1.XDSProxyConfig, error) {
	e := &s.Env
	cfg := &agentv1.XDSProxyConfig{
		DiscoveryAddress: s.DiscoveryAddress,
		ClusterId:        e.ClusterID,
		Headers:          s.Prefixed("XDS_HEADER_"),
		IstiodSan:        e.IstiodSAN,
		TokenPath:        s.Path(settings.TokenFile),
		NameTable:        s.DNSOn(),
		ProxyConfig:      e.ProxyConfigXDS,
		Wasm: &agentv1.WasmConfig{
			ConversionDisabled:    !e.WasmConversion,
			CacheDir:              s.Path(WasmCacheDir),
			PurgeInterval:         durationpb.New(e.WasmPurgeInterval.D()),
			ModuleExpiry:          durationpb.New(e.WasmModuleExpiry.D()),
			InsecureRegistries:    splitList(e.WasmInsecure),
			HttpRequestTimeout:    durationpb.New(e.WasmHTTPTimeout.D()),
			HttpRequestMaxRetries: int32(e.WasmHTTPMaxRetries),
			MaxBinarySizeBytes:    int64(e.WasmMaxBinarySize),
			BlockedCidrs:          splitList(e.WasmBlockedCIDRs),
		},
	}
	_, port, _ := net.SplitHostPort(cfg.DiscoveryAddress)
	cfg.Tls = s.ProxyConfig.GetControlPlaneAuthPolicy() != meshv1.AuthenticationPolicy_NONE && port != plaintextPort
	if !cfg.Tls {
		return cfg, nil
	}
	var err error
	if cfg.RootCert, err = xdsRoot(s); err != nil {
		return nil, err
	}
	switch {
	case e.ProvCert != "":
		cfg.CertChain = s.Path(filepath.Join(e.ProvCert, "cert-chain.pem"))
		cfg.Key = s.Path(filepath.Join(e.ProvCert, "key.pem"))
	case e.FileMountedCerts && e.TLSClientCertChain != "" && e.TLSClientKey != "":
		cfg.CertChain, cfg.Key = s.Path(e.TLSClientCertChain), s.Path(e.TLSClientKey)
	}
	return cfg, nil
}

// xdsRoot is Istio's resolution of the roots that verify the control plane, an absolute
// path or "" for the system roots: XDS_ROOT_CA (SYSTEM or a path), etc/certs/root-cert.pem
// if it exists, PROV_CERT's root-cert.pem, the file-mounted ISTIO_META_TLS_CLIENT_ROOT_CERT,
// an error with PILOT_CERT_PROVIDER=none, else the istiod root of istio-ca-root-cert.
func xdsRoot(s *settings.Settings) (string, error) {
	e := &s.Env
	switch {
	case e.XDSRootCA == "SYSTEM":
		return "", nil
	case e.XDSRootCA != "":
		return s.Path(e.XDSRootCA), nil
	case s.Files.LegacyRootCert:
		return s.Path(filepath.Join(settings.LegacyCertDir, "root-cert.pem")), nil
	case e.ProvCert != "":
		return s.Path(filepath.Join(e.ProvCert, "root-cert.pem")), nil
	case e.FileMountedCerts && e.TLSClientRootCert != "":
		return s.Path(e.TLSClientRootCert), nil
	case e.PilotCertProvider == "none":
		return "", errors.New("xDS root certificate: PILOT_CERT_PROVIDER=none and no XDS_ROOT_CA")
	}
	return s.Path(settings.IstiodRootCert), nil
}

// grpcBootstrapPath is where the gRPC xDS bootstrap of proxyless clients is written.
func grpcBootstrapPath(s *settings.Settings) string {
	return s.Path(cmp.Or(s.Env.GRPCXDSBootstrap, "etc/istio/proxy/grpc-bootstrap.json"))
}
