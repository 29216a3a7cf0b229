package agent

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/agentd/agentd/internal/sds"
	"github.com/agentd/agentd/internal/supervisor"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// Istio's SDS paths, relative to the root.
const (
	sdsSocketDir    = "var/run/secrets/workload-spiffe-uds"
	sdsFilesSocket  = "var/run/secrets/credential-uds/files-socket"
	workloadCertDir = "var/run/secrets/workload-spiffe-credentials"
	legacyCertDir   = "etc/certs"
	istiodRootCert  = "var/run/secrets/istio/root-cert.pem"
)

// sdsServer is the sds-server child, set up as Istio's agent sets up its secret manager and
// SDS server: the workload SDS socket (or, when a live SDS server such as SPIRE already owns
// it, the files-only socket and no CA), the CA client from CA_ADDR, CA_ROOT_CA, ISTIOD_SAN,
// the identity and key settings, OUTPUT_CERTS and the mounted certificate files.
func (a *Agent) sdsServer() (*supervisor.Child, error) {
	cfg, err := a.sdsConfig()
	if err != nil {
		return nil, err
	}
	name := a.opts.getenv("WORKLOAD_IDENTITY_SOCKET_FILE")
	if name == "" {
		name = "socket"
	}
	if strings.ContainsRune(name, '/') {
		return nil, fmt.Errorf("WORKLOAD_IDENTITY_SOCKET_FILE %q: want a file name, not a path", name)
	}
	workload := filepath.Join(sdsSocketDir, name)
	if liveSocket(a.rootedPath(workload)) {
		a.log.Info("a live SDS server owns the workload socket: serving files only", "socket", workload, "files_socket", sdsFilesSocket)
		cfg.FilesOnly, cfg.CaAddress = true, ""
		return a.helper("sds-server", cfg, supervisor.Socket{
			Name: agentv1.SocketSDSFiles, Network: "unix", Address: sdsFilesSocket, Mode: 0o666,
		}), nil
	}
	if name != "socket" {
		return nil, fmt.Errorf("WORKLOAD_IDENTITY_SOCKET_FILE %q: no live SDS server at %s", name, workload)
	}
	return a.helper("sds-server", cfg, supervisor.Socket{
		Name: agentv1.SocketSDSWorkload, Network: "unix", Address: workload, Mode: 0o666,
	}), nil
}

func (a *Agent) sdsConfig() (*agentv1.SDSConfig, error) {
	env := a.opts.getenv
	cfg := &agentv1.SDSConfig{
		TokenFile:             sds.DefaultTokenFile,
		ClusterId:             firstNonEmpty(env("ISTIO_META_CLUSTER_ID"), env("CLUSTER_ID"), "Kubernetes"),
		CaHeaders:             envPrefixed(a.opts.Env, "CA_HEADER_"),
		CertSigner:            env("ISTIO_META_CERT_SIGNER"),
		TrustDomain:           env("TRUST_DOMAIN"),
		PodNamespace:          env("POD_NAMESPACE"),
		ServiceAccount:        env("SERVICE_ACCOUNT"),
		EccSignatureAlgorithm: env("ECC_SIGNATURE_ALGORITHM"),
		EccCurve:              env("ECC_CURVE"),
		OutputCerts:           env("OUTPUT_CERTS"),
		OutputWorldReadable:   env("KUBERNETES_SERVICE_HOST") != "",
	}
	var err error
	if cfg.SecretTtl, err = parseEnvDuration(env, "SECRET_TTL"); err != nil {
		return nil, err
	}
	if cfg.FileDebounce, err = parseEnvDuration(env, "FILE_DEBOUNCE_DURATION"); err != nil {
		return nil, err
	}
	for key, dst := range map[string]*float64{
		"SECRET_GRACE_PERIOD_RATIO": &cfg.GracePeriodRatio, "SECRET_GRACE_PERIOD_RATIO_JITTER": &cfg.GracePeriodRatioJitter,
	} {
		if v := env(key); v != "" {
			if *dst, err = strconv.ParseFloat(v, 64); err != nil || *dst < 0 || *dst > 1 {
				return nil, fmt.Errorf("%s %q: want a number in [0, 1]", key, v)
			}
		}
	}
	if v := env("WORKLOAD_RSA_KEY_SIZE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("WORKLOAD_RSA_KEY_SIZE %q: %w", v, err)
		}
		cfg.RsaKeySize = int32(n)
	}
	if cfg.Pkcs8Key, err = parseEnvBool(env, "PKCS8_KEY"); err != nil {
		return nil, err
	}
	fileMounted, err := parseEnvBool(env, "FILE_MOUNTED_CERTS")
	if err != nil {
		return nil, err
	}
	// Mounted certificates: the workload-spiffe-credentials files when all three are there,
	// else etc/certs (served instead of the CA whenever they exist, as Istio does).
	dir := legacyCertDir
	if a.allFilesExist(workloadCertDir, "cert-chain.pem", "key.pem", "root-cert.pem") {
		dir, fileMounted = workloadCertDir, true
	}
	cfg.CertChainFile = filepath.Join(dir, "cert-chain.pem")
	cfg.KeyFile = filepath.Join(dir, "key.pem")
	cfg.RootCertFile = filepath.Join(dir, "root-cert.pem")
	if fileMounted {
		return cfg, nil // no CA client
	}
	cfg.CaAddress = env("CA_ADDR")
	if cfg.CaAddress == "" {
		cfg.CaAddress = a.opts.DiscoveryAddress
		cfg.CaServerName = env("ISTIOD_SAN")
	}
	if cfg.CaAddress == "" {
		return nil, fmt.Errorf("no CA address: set CA_ADDR or the discovery address")
	}
	cfg.CaRootCert = caRoot(env)
	if cfg.CaRootCert != "SYSTEM" {
		cfg.TrustAnchorsFile = cfg.CaRootCert
	}
	return cfg, nil
}

// caRoot is Istio's resolution of the roots that verify the CA: CA_ROOT_CA (a path or
// SYSTEM), etc/certs/root-cert.pem when PILOT_CERT_PROVIDER=custom, PROV_CERT's
// root-cert.pem, else the istiod root mounted from the istio-ca-root-cert ConfigMap.
func caRoot(env func(string) string) string {
	switch {
	case env("CA_ROOT_CA") != "":
		return env("CA_ROOT_CA")
	case env("PILOT_CERT_PROVIDER") == "custom":
		return filepath.Join(legacyCertDir, "root-cert.pem")
	case env("PROV_CERT") != "":
		return filepath.Join(env("PROV_CERT"), "root-cert.pem")
	}
	return istiodRootCert
}

// liveSocket reports whether something answers on the Unix socket at path (Istio probes an
// existing workload socket before it takes it over).
func liveSocket(path string) bool {
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		return false
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func (a *Agent) rootedPath(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(a.opts.Root, p)
}

func (a *Agent) allFilesExist(dir string, names ...string) bool {
	for _, n := range names {
		if fi, err := os.Stat(a.rootedPath(filepath.Join(dir, n))); err != nil || fi.Size() == 0 {
			return false
		}
	}
	return true
}

// prefixed returns the variables of env that start with prefix, keyed by the rest of the name.
func envPrefixed(env []string, prefix string) map[string]string {
	out := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, prefix) && len(k) > len(prefix) {
			out[strings.TrimPrefix(k, prefix)] = v
		}
	}
	return out
}

func parseEnvDuration(env func(string) string, key string) (*durationpb.Duration, error) {
	v := env(key)
	if v == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return nil, fmt.Errorf("%s %q: want a positive duration", key, v)
	}
	return durationpb.New(d), nil
}

func parseEnvBool(env func(string) string, key string) (bool, error) {
	v := env(key)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s %q: %w", key, v, err)
	}
	return b, nil
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
