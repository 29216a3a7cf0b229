package agent

import (
	"fmt"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/agentd/agentd/internal/settings"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// sdsConfig is sds-server's configuration and the socket it serves, as Istio's agent sets up
// its secret manager and SDS server: the workload SDS socket (or, when a live SDS server such
// as SPIRE already owns it, the files-only socket and no CA), the CA client from CA_ADDR,
// CA_ROOT_CA, ISTIOD_SAN, the identity and key settings, OUTPUT_CERTS and the mounted
// certificate files.
func sdsConfig(s *settings.Settings) (*agentv1.SDSConfig, socketSpec, error) {
	e := &s.Env
	name := e.WorkloadIdentitySocketFile
	if strings.ContainsRune(name, '/') {
		return nil, socketSpec{}, fmt.Errorf("WORKLOAD_IDENTITY_SOCKET_FILE %q: want a file name, not a path", name)
	}
	cfg := &agentv1.SDSConfig{
		TokenFile:              settings.TokenFile,
		ClusterId:              e.ClusterID,
		CaHeaders:              s.Prefixed("CA_HEADER_"),
		CertSigner:             e.CertSigner,
		TrustDomain:            e.TrustDomain,
		PodNamespace:           e.PodNamespace,
		ServiceAccount:         e.ServiceAccount,
		SecretTtl:              durationpb.New(e.SecretTTL.D()),
		FileDebounce:           durationpb.New(e.FileDebounce.D()),
		GracePeriodRatio:       float64(e.GracePeriodRatio),
		GracePeriodRatioJitter: float64(e.GracePeriodRatioJitter),
		RsaKeySize:             int32(e.RSAKeySize),
		EccSignatureAlgorithm:  string(e.ECCSignatureAlgorithm),
		EccCurve:               string(e.ECCCurve),
		Pkcs8Key:               e.PKCS8Key,
		OutputCerts:            e.OutputCerts,
		OutputWorldReadable:    e.KubernetesServiceHost != "",
	}
	// Mounted certificates: the workload-spiffe-credentials files when all three are there,
	// else etc/certs (served instead of the CA whenever they exist, as Istio does).
	dir, fileMounted := settings.LegacyCertDir, e.FileMountedCerts
	if s.Files.WorkloadCerts {
		dir, fileMounted = settings.WorkloadCertDir, true
	}
	cfg.CertChainFile = filepath.Join(dir, "cert-chain.pem")
	cfg.KeyFile = filepath.Join(dir, "key.pem")
	cfg.RootCertFile = filepath.Join(dir, "root-cert.pem")

	workload := socketSpec{Name: agentv1.SocketSDSWorkload, Network: "unix", Address: s.SDSSocket(), Mode: 0o666}
	switch {
	case s.Files.LiveSDS:
		cfg.FilesOnly = true
		return cfg, socketSpec{Name: agentv1.SocketSDSFiles, Network: "unix", Address: settings.SDSFilesSocket, Mode: 0o666}, nil
	case name != "socket":
		return nil, socketSpec{}, fmt.Errorf("WORKLOAD_IDENTITY_SOCKET_FILE %q: no live SDS server at %s", name, s.SDSSocket())
	case fileMounted:
		return cfg, workload, nil // no CA client
	}
	cfg.CaAddress = e.CAAddr
	if cfg.CaAddress == "" {
		cfg.CaAddress, cfg.CaServerName = s.DiscoveryAddress, e.IstiodSAN
	}
	if cfg.CaAddress == "" {
		return nil, socketSpec{}, fmt.Errorf("no CA address: set CA_ADDR or the discovery address")
	}
	cfg.CaRootCert = caRoot(e)
	return cfg, workload, nil
}

// caRoot is Istio's resolution of the roots that verify the CA: CA_ROOT_CA (a path or
// SYSTEM), etc/certs/root-cert.pem when PILOT_CERT_PROVIDER=custom, PROV_CERT's
// root-cert.pem, else the istiod root mounted from the istio-ca-root-cert ConfigMap.
func caRoot(e *settings.Env) string {
	switch {
	case e.CARootCA != "":
		return e.CARootCA
	case e.PilotCertProvider == "custom":
		return filepath.Join(settings.LegacyCertDir, "root-cert.pem")
	case e.ProvCert != "":
		return filepath.Join(e.ProvCert, "root-cert.pem")
	}
	return settings.IstiodRootCert
}
