package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"istio.io/api/annotation"

	"github.com/agentd/agentd/internal/envoy"
	"github.com/agentd/agentd/internal/supervisor"
)

// ProxyArgs are pilot-agent's `proxy` command line (`agentd proxy sidecar|router …`); the
// zero value is Istio's defaults.
type ProxyArgs struct {
	Type              string // sidecar (default) or router
	Domain            string // --domain (default <POD_NAMESPACE>.svc.cluster.local)
	MeshConfigFile    string // --meshConfig (default ./etc/istio/config/mesh)
	ServiceCluster    string // --serviceCluster (default istio-proxy)
	LogLevel          string // --proxyLogLevel (default warning,misc:error)
	ComponentLogLevel string // --proxyComponentLogLevel
	Concurrency       int    // --concurrency (0: unset)
	TemplateFile      string // --templateFile (not supported: refused)
	OutlierLogPath    string // --outlierLogPath
	StsPort           int    // --stsPort (node metadata only)
}

// errEnvoyExited is why agentd stops when Envoy exits and AGENTD_EXIT_ON_ENVOY_EXIT is set.
var errEnvoyExited = errors.New("Envoy exited")

// Istio's defaults for Envoy.
const (
	defaultMeshConfigFile = "./etc/istio/config/mesh"
	defaultMinDrain       = 5 * time.Second
	defaultMaxDrain       = 25 * time.Second // fits Kubernetes' default 30 s grace period
	defaultProxyLogLevel  = "warning,misc:error"
)

// envoy is Envoy's child: a plain process (not a plugin) that reads the bootstrap agentd
// writes to etc/istio/proxy/envoy-rev.json, ADS from xds-proxy's XDS socket and certificates
// from sds-server's SDS socket. Istio's environment variables: POD_NAME, POD_NAMESPACE,
// INSTANCE_IP, SERVICE_ACCOUNT, PROXY_CONFIG, ISTIO_CPU_LIMIT, ISTIO_META_*, ISTIO_METAJSON_*,
// ISTIO_DELTA_XDS (true), ISTIO_DUAL_STACK, EXIT_ON_ZERO_ACTIVE_CONNECTIONS,
// MINIMUM_DRAIN_DURATION (5s), ENVOY_STATUS_PORT (15021), ENVOY_PROMETHEUS_PORT (15090),
// XDS_ROOT_CA, ENVOY_SKIP_DEPRECATED_LOGS (true), ISTIO_ENVOY_ENABLE_CORE_DUMP,
// ISTIO_BOOTSTRAP_OVERRIDE, HOST_IP, WORKLOAD_IDENTITY_SOCKET_FILE; and agentd's own
// AGENTD_MAX_DRAIN_DURATION (25s), the bound of the wait for zero connections, and
// AGENTD_EXIT_ON_ENVOY_EXIT (false): true stops agentd when Envoy exits, as Istio's agent does,
// instead of restarting Envoy.
func (a *Agent) envoy() (*supervisor.Child, error) {
	if a.opts.DisableEnvoy {
		return nil, nil
	}
	cfg, popts, err := a.envoyConfig()
	if err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	if a.opts.StatusPort == 0 { // agent proxy: the status server listens where Istio's would
		a.opts.StatusPort = int(cfg.ProxyConfig.StatusPort)
	}
	// A broken input fails here, before anything starts.
	if _, err := envoy.Bootstrap(cfg); err != nil && popts.Prepare != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	need := popts.TerminationDrainDuration
	if popts.ExitOnZeroActiveConnections {
		need = popts.MinimumDrainDuration + popts.MaxDrainDuration
	}

	binary := a.opts.EnvoyBinary
	if binary == "" {
		binary = envoyOnHost(cfg.ProxyConfig.BinaryPath)
	}
	if js, err := protojson.Marshal(cfg.ProxyConfig); err == nil {
		a.log.Info("effective ProxyConfig", "config", string(js))
	}
	if a.opts.Proxy.Concurrency > 0 {
		a.log.Warn("--concurrency overrides the ProxyConfig's concurrency (legacy flag)", "concurrency", a.opts.Proxy.Concurrency)
	}
	a.log.Info("Envoy", "node", cfg.NodeID(), "binary", binary, "args", strings.Join(popts.Args, " "))
	return &supervisor.Child{
		Name: "envoy", Binary: binary, Launch: envoy.Launch(popts),
		// Its first xDS and SDS streams are answered at once rather than queued.
		After: []string{"sds-server", "xds-proxy"},
		// Envoy drains as long as it is told to, and it waits for its control plane as long as
		// it takes (as Istio's agent does): restarting it would not bring the answer sooner.
		DrainTimeout: need + time.Second,
		ReadyTimeout: envoyReadyTimeout,
	}, nil
}

// envoyOnHost is the ProxyConfig's binaryPath, or, where nothing is there (a development
// machine, a VM with Envoy elsewhere), the envoy on PATH.
func envoyOnHost(binaryPath string) string {
	if _, err := os.Stat(binaryPath); err != nil {
		if p, err := exec.LookPath("envoy"); err == nil {
			return p
		}
	}
	return binaryPath
}

// envoyReadyTimeout is how long Envoy may stay unready before it is started again.
const envoyReadyTimeout = time.Hour

// envoyConfig returns the bootstrap's input and the process options, assembled once as
// pilot-agent does: xds-proxy, the prober and the status server read the same merged
// ProxyConfig and node.
func (a *Agent) envoyConfig() (*envoy.Config, envoy.ProcessOptions, error) {
	if a.proxyCfg == nil {
		cfg, popts, err := a.assembleEnvoyConfig()
		if err != nil {
			return nil, envoy.ProcessOptions{}, err
		}
		a.proxyCfg, a.proxyOpts = cfg, popts
	}
	return a.proxyCfg, a.proxyOpts, nil
}

func (a *Agent) assembleEnvoyConfig() (*envoy.Config, envoy.ProcessOptions, error) {
	o, p := &a.opts, a.opts.Proxy
	root := a.opts.Root
	typ, err := envoy.ParseProxyType(p.Type)
	if err != nil {
		return nil, envoy.ProcessOptions{}, err
	}
	labels, err := envoy.ReadPodInfo(filepath.Join(root, "etc/istio/pod/labels"))
	if err != nil {
		return nil, envoy.ProcessOptions{}, fmt.Errorf("pod labels: %w", err)
	}
	annos, err := envoy.ReadPodInfo(filepath.Join(root, "etc/istio/pod/annotations"))
	if err != nil {
		return nil, envoy.ProcessOptions{}, fmt.Errorf("pod annotations: %w", err)
	}
	meshFile := p.MeshConfigFile
	if meshFile == "" {
		meshFile = defaultMeshConfigFile
	}
	if !filepath.IsAbs(meshFile) {
		meshFile = filepath.Join(root, meshFile)
	}
	mesh, err := os.ReadFile(meshFile)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, envoy.ProcessOptions{}, fmt.Errorf("mesh config file: %w", err)
	}
	ints, err := envInts(o, map[string]int{"ISTIO_CPU_LIMIT": 0, "ENVOY_STATUS_PORT": 15021, "ENVOY_PROMETHEUS_PORT": 15090})
	if err != nil {
		return nil, envoy.ProcessOptions{}, err
	}
	bools, err := envBools(o, map[string]bool{"ISTIO_DELTA_XDS": true, "ISTIO_DUAL_STACK": false, "EXIT_ON_ZERO_ACTIVE_CONNECTIONS": false,
		"ENVOY_SKIP_DEPRECATED_LOGS": true, "ISTIO_ENVOY_ENABLE_CORE_DUMP": false, "AGENTD_EXIT_ON_ENVOY_EXIT": false})
	if err != nil {
		return nil, envoy.ProcessOptions{}, err
	}
	durs, err := envDurations(o, map[string]time.Duration{"MINIMUM_DRAIN_DURATION": defaultMinDrain, "AGENTD_MAX_DRAIN_DURATION": defaultMaxDrain})
	if err != nil {
		return nil, envoy.ProcessOptions{}, err
	}
	pc, err := envoy.MergeProxyConfig(envoy.ProxyConfigSources{
		MeshConfig: string(mesh), Env: o.getenv("PROXY_CONFIG"), Annotations: annos,
		ServiceCluster: p.ServiceCluster, Concurrency: p.Concurrency, CPULimit: ints["ISTIO_CPU_LIMIT"],
	})
	if err != nil {
		return nil, envoy.ProcessOptions{}, err
	}
	if o.StatusPort > 0 { // the port agentd's status server really listens on
		pc.StatusPort = int32(o.StatusPort)
	}
	if p.TemplateFile != "" || pc.ProxyBootstrapTemplatePath != "" {
		return nil, envoy.ProcessOptions{}, errors.New("custom bootstrap templates (--templateFile, proxyBootstrapTemplatePath) are not supported; use customConfigFile or ISTIO_BOOTSTRAP_OVERRIDE")
	}
	var exclude []string
	if v := annos[annotation.SidecarTrafficExcludeInterfaces.Name]; v != "" {
		exclude = strings.Split(v, ",")
	}
	sds := envoy.DefaultSDSSocket
	if f := o.getenv("WORKLOAD_IDENTITY_SOCKET_FILE"); f != "" {
		sds = "./var/run/secrets/workload-spiffe-uds/" + f
	}
	cfg := &envoy.Config{
		Type:           typ,
		PodName:        o.getenv("POD_NAME"),
		PodNamespace:   o.getenv("POD_NAMESPACE"),
		ServiceAccount: o.getenv("SERVICE_ACCOUNT"),
		Domain:         p.Domain,
		IPs:            envoy.ProxyIPs(o.getenv("INSTANCE_IP"), exclude),
		ProxyConfig:    pc,
		Labels:         labels,
		Annotations:    annos,
		Env:            o.Env,
		DeltaXDS:       bools["ISTIO_DELTA_XDS"], DualStack: bools["ISTIO_DUAL_STACK"],
		ExitOnZeroActiveConnections: bools["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"],
		EnvoyStatusPort:             ints["ENVOY_STATUS_PORT"],
		EnvoyPrometheusPort:         ints["ENVOY_PROMETHEUS_PORT"],
		SDSSocket:                   sds,
		OutlierLogPath:              p.OutlierLogPath,
		StsPort:                     p.StsPort,
		PilotSAN:                    []string{pilotSAN(pc.DiscoveryAddress)},
		XDSRootCA:                   o.getenv("XDS_ROOT_CA"),
		DNSProxyAddr:                o.DNSAddress,
	}
	bootstrapPath := envoy.BootstrapFile
	prepare := func() error { return envoy.WriteBootstrap(cfg, filepath.Join(root, bootstrapPath)) }
	cleanup := func() { os.Remove(filepath.Join(root, bootstrapPath)) }
	if pc.CustomConfigFile != "" { // used verbatim, and kept
		bootstrapPath, prepare, cleanup = pc.CustomConfigFile, nil, nil
	}
	logLevel := p.LogLevel
	if logLevel == "" {
		logLevel = defaultProxyLogLevel
	}
	args, err := envoy.Args(cfg, envoy.CommandOptions{
		BootstrapPath: bootstrapPath, LogLevel: logLevel, ComponentLogLevel: p.ComponentLogLevel,
		SkipDeprecatedLogs: bools["ENVOY_SKIP_DEPRECATED_LOGS"], EnableCoreDump: bools["ISTIO_ENVOY_ENABLE_CORE_DUMP"],
		BootstrapOverride: o.getenv("ISTIO_BOOTSTRAP_OVERRIDE"), HostIP: o.getenv("HOST_IP"),
	})
	if err != nil {
		return nil, envoy.ProcessOptions{}, err
	}
	localhost := "127.0.0.1"
	if allColon(cfg.IPs) {
		localhost = "::1"
	}
	var onExit func(error)
	if bools["AGENTD_EXIT_ON_ENVOY_EXIT"] {
		var exited atomic.Bool
		onExit = func(err error) {
			exited.Store(true)
			a.log.Warn("Envoy exited: stopping agentd, as Istio's agent does (AGENTD_EXIT_ON_ENVOY_EXIT)", "error", err)
			a.status.stop(errEnvoyExited)
		}
		if write := prepare; write != nil {
			prepare = func() error {
				if exited.Load() { // the supervisor's restart, while agentd stops
					return errEnvoyExited
				}
				return write()
			}
		}
	}
	return cfg, envoy.ProcessOptions{
		Args: args, Dir: root, Env: o.Env,
		AdminHost: localhost, AdminPort: int(pc.ProxyAdminPort),
		InboundOnly:                 typ == envoy.Sidecar,
		TerminationDrainDuration:    pc.GetTerminationDrainDuration().AsDuration(),
		ExitOnZeroActiveConnections: cfg.ExitOnZeroActiveConnections,
		MinimumDrainDuration:        durs["MINIMUM_DRAIN_DURATION"],
		MaxDrainDuration:            durs["AGENTD_MAX_DRAIN_DURATION"],
		ExcludedListeners:           envoy.IstioListenerStats(cfg.EnvoyStatusPort, cfg.EnvoyPrometheusPort),
		Control:                     &a.envoyDrain,
		OnUnexpectedExit:            onExit,
		Prepare:                     prepare,
		Cleanup:                     cleanup,
		Log:                         a.log.Named("envoy"),
	}, nil
}

func allColon(ips []string) bool {
	for _, ip := range ips {
		if !strings.Contains(ip, ":") {
			return false
		}
	}
	return true
}

// pilotSAN is the name istiod's certificate is checked against (Istio's GetPilotSan).
func pilotSAN(discoveryAddress string) string {
	host, _, _ := strings.Cut(discoveryAddress, ":")
	if host == "localhost" {
		return "istiod.istio-system.svc"
	}
	return host
}

func envInts(o *Options, defaults map[string]int) (map[string]int, error) {
	out := map[string]int{}
	for k, d := range defaults {
		out[k] = d
		if v := o.getenv(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("%s=%q: want a non-negative integer", k, v)
			}
			out[k] = n
		}
	}
	return out, nil
}

func envBools(o *Options, defaults map[string]bool) (map[string]bool, error) {
	out := map[string]bool{}
	for k, d := range defaults {
		out[k] = d
		if v := o.getenv(k); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, fmt.Errorf("%s=%q: want true or false", k, v)
			}
			out[k] = b
		}
	}
	return out, nil
}

func envDurations(o *Options, defaults map[string]time.Duration) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for k, d := range defaults {
		out[k] = d
		if v := o.getenv(k); v != "" {
			dur, err := time.ParseDuration(v)
			if err != nil || dur < 0 {
				return nil, fmt.Errorf("%s=%q: want a non-negative duration", k, v)
			}
			out[k] = dur
		}
	}
	return out, nil
}
