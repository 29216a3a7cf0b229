package agent

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"istio.io/api/annotation"
	meshv1 "istio.io/api/mesh/v1alpha1"

	"github.com/agentd/agentd/internal/buildinfo"
	"github.com/agentd/agentd/internal/envoy"
	"github.com/agentd/agentd/internal/envoy/bootstrap"
	"github.com/agentd/agentd/internal/settings"
)

// envoyReadyTimeout is how long Envoy may stay unready before it is started again: Envoy
// waits for its control plane as long as it takes, as Istio's agent lets it.
const envoyReadyTimeout = time.Hour

// bootstrapConfig is the input of Envoy's bootstrap and command line, as pilot-agent derives
// it: the pod, the merged ProxyConfig, the node's metadata variables and Envoy's settings.
func bootstrapConfig(s *settings.Settings) *bootstrap.Config {
	e := &s.Env
	pc := s.ProxyConfig
	if s.Proxy.TemplateFile != "" && pc.GetCustomConfigFile() == "" { // as pilot-agent: the flag sets the ProxyConfig's
		pc = proto.Clone(pc).(*meshv1.ProxyConfig)
		pc.ProxyBootstrapTemplatePath = s.Proxy.TemplateFile
	}
	var exclude []string
	if v := s.Annotations[annotation.SidecarTrafficExcludeInterfaces.Name]; v != "" {
		exclude = strings.Split(v, ",")
	}
	return &bootstrap.Config{
		Type:                        s.ProxyType,
		PodName:                     e.PodName,
		PodNamespace:                e.PodNamespace,
		ServiceAccount:              e.ServiceAccount,
		Domain:                      s.Domain,
		IPs:                         bootstrap.ProxyIPs(e.InstanceIP, exclude),
		ProxyConfig:                 pc,
		Labels:                      s.Labels,
		Annotations:                 s.Annotations,
		Env:                         s.Environ,
		DeltaXDS:                    e.DeltaXDS,
		DualStack:                   e.DualStack,
		ExitOnZeroActiveConnections: e.ExitOnZeroActiveConnections,
		EnvoyStatusPort:             int(e.EnvoyStatusPort),
		EnvoyPrometheusPort:         int(e.EnvoyPrometheusPort),
		SkipDeprecatedLogs:          e.SkipDeprecatedLogs,
		WorkloadIdentitySocketFile:  e.WorkloadIdentitySocketFile,
		IstioVersion:                buildinfo.IstioVersion,
		OutlierLogPath:              s.Proxy.OutlierLogPath,
		StsPort:                     s.Proxy.StsPort,
		PilotSAN:                    []string{pilotSAN(pc.GetDiscoveryAddress())},
		DNSProxyAddr:                s.Getenv("DNS_PROXY_ADDR"), // the variable only, as Istio
		StatusPortProxyProtocol:     e.StatusPortProxyProtocol,
		MetadataDiscovery:           metadataDiscovery(s),
		LogAsJSON:                   s.Proxy.LogAsJSON,
		CredentialSocket:            s.Files.CredentialSocket,
		FileCredentials:             s.Files.LiveSDS,
	}
}

// metadataDiscovery is the node's METADATA_DISCOVERY: PEER_METADATA_DISCOVERY when set, else
// whether the proxy is on ambient's HBONE (ISTIO_META_ENABLE_HBONE), as Istio decides.
func metadataDiscovery(s *settings.Settings) bool {
	if d := s.Env.PeerMetadataDiscovery; d.Set {
		return d.Value
	}
	hbone, _ := strconv.ParseBool(s.Getenv("ISTIO_META_ENABLE_HBONE"))
	return hbone
}

// bootstrapTemplate is the template pilot-agent renders (proxyBootstrapTemplatePath, which
// --templateFile sets, or the proxy image's), or "" where the image has none: agentd's own
// bootstrap then, which is what Istio's template renders. A named template that is missing
// is an error, as it stops pilot-agent.
func bootstrapTemplate(s *settings.Settings, pc *meshv1.ProxyConfig) (string, error) {
	tmpl, named := bootstrap.TemplatePath(s.Env.BootstrapTemplate, pc.GetProxyBootstrapTemplatePath())
	if _, err := os.Stat(s.Path(tmpl)); err != nil {
		if named {
			return "", fmt.Errorf("bootstrap template: %w", err)
		}
		return "", nil
	}
	return tmpl, nil
}

// envoyCommand is Envoy's argv after the binary and the bootstrap file it reads (relative to
// the root): the template rendered or agentd's own (envoy-rev.json in configPath), or the
// ProxyConfig's customConfigFile, used as it is.
func envoyCommand(s *settings.Settings, cfg *bootstrap.Config) (args []string, bootstrapPath string, err error) {
	tmpl, err := bootstrapTemplate(s, cfg.ProxyConfig)
	if err != nil {
		return nil, "", err
	}
	bootstrapPath = bootstrap.OutputFile(cfg.ProxyConfig.GetConfigPath(), tmpl)
	if f := cfg.ProxyConfig.GetCustomConfigFile(); f != "" {
		bootstrapPath = f
	}
	args, err = bootstrap.Args(cfg, bootstrap.CommandOptions{
		BootstrapPath: bootstrapPath, LogLevel: s.Proxy.LogLevel, ComponentLogLevel: s.Proxy.ComponentLogLevel,
		EnableCoreDump: s.Env.EnableCoreDump, BootstrapOverride: s.Env.BootstrapOverride, HostIP: s.Env.HostIP,
	})
	return args, bootstrapPath, err
}

// envoyProcess is how Envoy's process is run and drained: its admin API, Istio's drain
// settings, the bootstrap written before each start.
func envoyProcess(s *settings.Settings, cfg *bootstrap.Config, args []string, bootstrapPath string) envoy.ProcessOptions {
	pc := s.ProxyConfig
	localhost := "127.0.0.1"
	if allColon(cfg.IPs) {
		localhost = "::1"
	}
	o := envoy.ProcessOptions{
		Args: args, Dir: s.Root, Env: s.Environ,
		AdminHost: localhost, AdminPort: int(pc.GetProxyAdminPort()),
		InboundOnly:                 s.ProxyType == bootstrap.Sidecar,
		TerminationDrainDuration:    pc.GetTerminationDrainDuration().AsDuration(),
		ExitOnZeroActiveConnections: cfg.ExitOnZeroActiveConnections,
		MinimumDrainDuration:        s.Env.MinimumDrainDuration.D(),
		MaxDrainDuration:            s.Env.MaxDrainDuration.D(),
		ExcludedListeners:           envoy.IstioListenerStats(cfg.EnvoyStatusPort, cfg.EnvoyPrometheusPort),
	}
	if pc.GetCustomConfigFile() == "" { // the bootstrap, written before each start
		path := s.Path(bootstrapPath)
		o.Prepare = func() error { return bootstrap.Write(cfg, path) }
		if tmpl, _ := bootstrapTemplate(s, cfg.ProxyConfig); tmpl != "" {
			o.Prepare = func() error { return bootstrap.RenderFile(cfg, s.Path(tmpl), path) }
		}
		o.Cleanup = func() { os.Remove(path) }
	}
	return o
}

// envoyDrainTimeout is how long Envoy's drain may take: as long as it is told to drain.
func envoyDrainTimeout(o envoy.ProcessOptions) time.Duration {
	if o.ExitOnZeroActiveConnections {
		return o.MinimumDrainDuration + o.MaxDrainDuration + time.Second
	}
	return o.TerminationDrainDuration + time.Second
}

// envoyBinary is --envoy-binary, else the ProxyConfig's binaryPath, or, where nothing is
// there (a development machine, a VM with Envoy elsewhere), the envoy on PATH.
func envoyBinary(s *settings.Settings) string {
	if s.Flags.EnvoyBinary != "" {
		return s.Flags.EnvoyBinary
	}
	binaryPath := s.ProxyConfig.GetBinaryPath()
	if _, err := os.Stat(binaryPath); err != nil {
		if p, err := exec.LookPath("envoy"); err == nil {
			return p
		}
	}
	return binaryPath
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
