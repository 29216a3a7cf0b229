package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"istio.io/api/annotation"

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
		ProxyConfig:                 s.ProxyConfig,
		Labels:                      s.Labels,
		Annotations:                 s.Annotations,
		Env:                         s.Environ,
		DeltaXDS:                    e.DeltaXDS,
		DualStack:                   e.DualStack,
		ExitOnZeroActiveConnections: e.ExitOnZeroActiveConnections,
		EnvoyStatusPort:             int(e.EnvoyStatusPort),
		EnvoyPrometheusPort:         int(e.EnvoyPrometheusPort),
		SDSSocket:                   "./" + s.SDSSocket(),
		OutlierLogPath:              s.Proxy.OutlierLogPath,
		StsPort:                     s.Proxy.StsPort,
		PilotSAN:                    []string{pilotSAN(s.ProxyConfig.GetDiscoveryAddress())},
		XDSRootCA:                   e.XDSRootCA,
		DNSProxyAddr:                s.DNSAddress,
	}
}

// envoyCommand is Envoy's argv after the binary and the bootstrap file it reads (relative to
// the root): agentd's own, or the ProxyConfig's customConfigFile, used as it is.
func envoyCommand(s *settings.Settings, cfg *bootstrap.Config) (args []string, bootstrapPath string, err error) {
	bootstrapPath = bootstrap.File
	if f := s.ProxyConfig.GetCustomConfigFile(); f != "" {
		bootstrapPath = f
	}
	args, err = bootstrap.Args(cfg, bootstrap.CommandOptions{
		BootstrapPath: bootstrapPath, LogLevel: s.Proxy.LogLevel, ComponentLogLevel: s.Proxy.ComponentLogLevel,
		SkipDeprecatedLogs: s.Env.SkipDeprecatedLogs, EnableCoreDump: s.Env.EnableCoreDump,
		BootstrapOverride: s.Env.BootstrapOverride, HostIP: s.Env.HostIP,
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
	if pc.GetCustomConfigFile() == "" { // agentd's bootstrap, written before each start
		path := filepath.Join(s.Root, bootstrapPath)
		o.Prepare = func() error { return bootstrap.Write(cfg, path) }
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
