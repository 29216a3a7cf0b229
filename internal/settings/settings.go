// Package settings resolves everything agentd reads — its command line, Istio's environment
// variables (the Env table), the mesh config file, PROXY_CONFIG, the pod's annotations and
// labels, Istio's VM files — once, into one Settings value. Every child's configuration is a
// pure function of it (package agent), so a setting is followed from its flag or variable to
// the process that uses it through the table and one function.
package settings

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	meshv1 "istio.io/api/mesh/v1alpha1"

	"github.com/agentd/agentd/internal/envoy/bootstrap"
	"github.com/agentd/agentd/internal/vmconfig"
)

// Flags is agentd's command line, from `agentd run` or `agentd proxy` (pilot-agent's): the
// zero value of each field means "not given".
type Flags struct {
	// Root is where Istio's relative paths live (etc/istio/proxy, var/run/secrets, ...);
	// default the working directory.
	Root string
	// HelpersDir holds the helper binaries; default agentd's own folder.
	HelpersDir string
	// DisableEnvoy runs without Envoy (or DISABLE_ENVOY).
	DisableEnvoy bool
	// EnvoyBinary is Envoy's path; default ProxyConfig binaryPath, else envoy on PATH.
	EnvoyBinary string
	// DiscoveryAddress is the upstream xDS server; default ProxyConfig discoveryAddress.
	DiscoveryAddress string
	// DNSAddress is dns-proxy's address; default DNS_PROXY_ADDR.
	DNSAddress string
	// ResolvConf holds dns-proxy's upstreams and search list; default /etc/resolv.conf.
	ResolvConf string
	// StatusPort is the status server's port; default ProxyConfig statusPort (15020).
	StatusPort int
	// The supervisor's timeouts (zero: the supervisor's defaults).
	ReadyTimeout, DrainTimeout, StopTimeout time.Duration
	// Proxy is pilot-agent's `proxy` command line.
	Proxy ProxyFlags
}

// ProxyFlags are pilot-agent's `proxy [sidecar|router]` flags.
type ProxyFlags struct {
	Type              string // sidecar (default) or router
	Domain            string // --domain; default <POD_NAMESPACE>.svc.cluster.local
	MeshConfigFile    string // --meshConfig; default ./etc/istio/config/mesh
	ServiceCluster    string // --serviceCluster; default istio-proxy
	LogLevel          string // --proxyLogLevel; default warning (Istio's flag default)
	ComponentLogLevel string // --proxyComponentLogLevel
	Concurrency       int    // --concurrency (legacy; 0: unset)
	TemplateFile      string // --templateFile
	OutlierLogPath    string // --outlierLogPath
	StsPort           int    // --stsPort (node metadata only)
	DisableProfiling  bool   // --profiling=false: no /debug/pprof on the status port
	LogAsJSON         bool   // --log_as_json: agentd's lines and Envoy's application log in JSON
}

// Settings is everything agentd and its children run with, resolved once.
type Settings struct {
	// Flags is the command line as given.
	Flags Flags
	// Env is the table's values (env.go).
	Env Env
	// Environ is agentd's environment after Istio's VM files, without systemd's variables
	// (a child given LISTEN_* or NOTIFY_SOCKET would take agentd's sockets or speak for it).
	// Envoy inherits it, as pilot-agent's Envoy does; the prefixed variables are read from it.
	Environ []string

	// Settled once, for every process that needs them: flags first, then the merged
	// ProxyConfig and the table, then Istio's defaults.
	Root             string     // absolute
	HelpersDir       string     // absolute
	Proxy            ProxyFlags // with Istio's defaults filled in
	DisableEnvoy     bool
	ResolvConf       string
	StatusPort       int    // the status server's port
	DiscoveryAddress string // the upstream xDS server
	Domain           string // the proxy's DNS domain
	DNSAddress       string // dns-proxy's UDP and TCP address
	ProxyType        bootstrap.ProxyType
	ProxyConfig      *meshv1.ProxyConfig // mesh file, PROXY_CONFIG, annotation, merged as Istio
	Labels           map[string]string   // etc/istio/pod/labels
	Annotations      map[string]string   // etc/istio/pod/annotations

	// What the file system holds at start, read here so that child configs stay pure.
	Files Files
}

// Files is what agentd found under its root at start.
type Files struct {
	// LegacyRootCert: etc/certs/root-cert.pem exists (it then verifies istiod).
	LegacyRootCert bool
	// WorkloadCerts: the three workload-spiffe-credentials files are there (served instead
	// of the CA's).
	WorkloadCerts bool
	// LiveSDS: a live SDS server (SPIRE) answers on the workload SDS socket.
	LiveSDS bool
	// CredentialSocket: a live SDS server answers on Istio's credential socket
	// (var/run/secrets/credential-uds/socket): Envoy's node says so.
	CredentialSocket bool
	// VM lists Istio's VM files read (cluster.env, sidecar.env), if any.
	VM []string
	// MeshConfig is the mesh config file's content.
	MeshConfig string
}

// Istio's defaults for the cross-cutting settings.
const (
	DefaultMeshConfigFile = "./etc/istio/config/mesh"
	DefaultResolvConf     = "/etc/resolv.conf"
	DefaultProxyLogLevel  = "warning"
)

// Resolve computes the Settings from the command line and the environment (os.Environ's
// form). Where Istio warns about a bad value and goes on, Resolve logs the warning and goes on
// with Istio's default; where Istio refuses, it returns the error.
func Resolve(f Flags, environ []string, log hclog.Logger) (*Settings, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s := &Settings{Flags: f, Proxy: f.Proxy, HelpersDir: f.HelpersDir}
	var err error
	if s.Root, err = filepath.Abs(cmp.Or(f.Root, ".")); err != nil {
		return nil, fmt.Errorf("root directory: %w", err)
	}
	if s.HelpersDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find the helpers next to agentd: %w", err)
		}
		s.HelpersDir = filepath.Dir(exe)
	}
	if s.HelpersDir, err = filepath.Abs(s.HelpersDir); err != nil {
		return nil, fmt.Errorf("helpers directory: %w", err)
	}
	s.Environ = withoutSystemd(environ)
	if err := s.loadVM(log); err != nil {
		return nil, err
	}
	if s.Env, err = parseEnv(s.Environ, log); err != nil {
		return nil, err
	}
	if err := s.resolveProxy(log); err != nil {
		return nil, err
	}
	s.resolveCrossCutting()
	s.Files.LegacyRootCert = fileExists(s.Path("etc/certs/root-cert.pem"))
	s.Files.WorkloadCerts = nonEmptyFiles(s.Path(WorkloadCertDir), "cert-chain.pem", "key.pem", "root-cert.pem")
	s.Files.LiveSDS = liveSocket(s.Path(s.SDSSocket()))
	s.Files.CredentialSocket = liveSocket(s.Path(CredentialSocket))
	return s, nil
}

// loadVM applies the environment istio-start.sh gives pilot-agent when the root holds Istio's
// VM files; elsewhere it does nothing.
func (s *Settings) loadVM(log hclog.Logger) error {
	vm, err := vmconfig.Load(s.Root, s.Environ, vmconfig.LocalHost)
	if err != nil || vm == nil {
		return err
	}
	s.Environ, s.Files.VM = vm.Env, vm.Files
	s.Proxy.ServiceCluster = cmp.Or(s.Proxy.ServiceCluster, vm.ServiceCluster)
	log.Info("Istio VM: environment from its env files, as istio-start.sh", "files", vm.Files)
	for _, path := range vm.Missing {
		log.Warn("Istio VM file missing: onboarding installs it", "path", path)
	}
	if v := s.Getenv("ISTIO_AGENT_FLAGS"); v != "" {
		log.Warn("ISTIO_AGENT_FLAGS is not read: put pilot-agent's flags on agentd's command line", "flags", v)
	}
	return nil
}

// resolveProxy reads the pod's files and the mesh config and merges the ProxyConfig, as
// pilot-agent's ConstructProxyConfig.
func (s *Settings) resolveProxy(log hclog.Logger) error {
	var err error
	if s.ProxyType, err = bootstrap.ParseProxyType(s.Proxy.Type); err != nil {
		return err
	}
	if s.Labels, err = bootstrap.ReadPodInfo(s.Path("etc/istio/pod/labels")); err != nil {
		return fmt.Errorf("pod labels: %w", err)
	}
	if s.Annotations, err = bootstrap.ReadPodInfo(s.Path("etc/istio/pod/annotations")); err != nil {
		return fmt.Errorf("pod annotations: %w", err)
	}
	mesh, err := os.ReadFile(s.Path(cmp.Or(s.Proxy.MeshConfigFile, DefaultMeshConfigFile)))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("mesh config file: %w", err)
	}
	s.Files.MeshConfig = string(mesh)
	if s.ProxyConfig, err = bootstrap.MergeProxyConfig(bootstrap.ProxyConfigSources{
		MeshConfig: s.Files.MeshConfig, Env: s.Env.ProxyConfig, Annotations: s.Annotations,
		ServiceCluster: s.Proxy.ServiceCluster, Concurrency: s.Proxy.Concurrency, CPULimit: int(s.Env.CPULimit),
		Warn: log.Warn,
	}); err != nil {
		return err
	}
	if s.Proxy.Concurrency > 0 {
		log.Warn("legacy --concurrency flag overrides the ProxyConfig's concurrency", "concurrency", s.Proxy.Concurrency)
	}
	return nil
}

// resolveCrossCutting settles the values several processes share: flags first, then the
// merged ProxyConfig and the table.
func (s *Settings) resolveCrossCutting() {
	pc := s.ProxyConfig
	// The merged ProxyConfig's statusPort is 15020 unless set; 0 (a status.sidecar.istio.io/port
	// that does not parse) is no status server, as in Istio.
	s.StatusPort = cmp.Or(s.Flags.StatusPort, int(pc.GetStatusPort()))
	pc.StatusPort = int32(s.StatusPort) // Envoy's bootstrap and the prober see the port agentd listens on
	s.DiscoveryAddress = cmp.Or(s.Flags.DiscoveryAddress, pc.GetDiscoveryAddress())
	s.Domain = cmp.Or(s.Proxy.Domain, s.Env.PodNamespace+".svc.cluster.local")
	s.DNSAddress = cmp.Or(s.Flags.DNSAddress, s.Env.DNSProxyAddr)
	s.ResolvConf = cmp.Or(s.Flags.ResolvConf, DefaultResolvConf)
	s.DisableEnvoy = s.Flags.DisableEnvoy || s.Env.DisableEnvoy
	s.Proxy.LogLevel = cmp.Or(s.Proxy.LogLevel, DefaultProxyLogLevel)
}

// Path is p under agentd's root, or p itself when absolute.
func (s *Settings) Path(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(s.Root, p)
}

// Getenv is the value of a variable in Environ ("" when unset).
func (s *Settings) Getenv(key string) string {
	for i := len(s.Environ) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(s.Environ[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// Prefixed returns the variables of Environ that start with prefix (one of Prefixes), keyed by
// the rest of the name.
func (s *Settings) Prefixed(prefix string) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, prefix) && len(k) > len(prefix) {
			out[strings.TrimPrefix(k, prefix)] = v
		}
	}
	return out
}

// DNSOn reports whether Istio's agent would run its DNS proxy.
func (s *Settings) DNSOn() bool { return s.Env.DNSCapture || s.Env.DNSServer }

// Istio's certificate and socket paths, relative to the root.
const (
	SDSSocketDir     = "var/run/secrets/workload-spiffe-uds"
	SDSFilesSocket   = "var/run/secrets/credential-uds/files-socket"
	CredentialSocket = "var/run/secrets/credential-uds/socket"
	WorkloadCertDir  = "var/run/secrets/workload-spiffe-credentials"
	LegacyCertDir    = "etc/certs"
	IstiodRootCert   = "var/run/secrets/istio/root-cert.pem"
	TokenFile        = "var/run/secrets/tokens/istio-token"
	XDSSocket        = "etc/istio/proxy/XDS"
)

// SDSSocket is the workload SDS socket's path under the root.
func (s *Settings) SDSSocket() string {
	return filepath.Join(SDSSocketDir, s.Env.WorkloadIdentitySocketFile)
}

// withoutSystemd drops systemd's variables: they are agentd's own.
func withoutSystemd(environ []string) []string {
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID":
			return true
		}
		return false
	})
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func nonEmptyFiles(dir string, names ...string) bool {
	for _, n := range names {
		if fi, err := os.Stat(filepath.Join(dir, n)); err != nil || fi.Size() == 0 {
			return false
		}
	}
	return true
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
