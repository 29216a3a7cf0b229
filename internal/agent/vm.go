package agent

import "github.com/agentd/agentd/internal/vmconfig"

// loadVM gives agentd the environment istio-start.sh gives pilot-agent when the root holds
// Istio's VM files (var/lib/istio/envoy/cluster.env, written by the VM's onboarding): the
// variables of sidecar.env and cluster.env and the script's defaults. Elsewhere it does
// nothing.
func (a *Agent) loadVM() error {
	vm, err := vmconfig.Load(a.opts.Root, a.opts.Env, vmconfig.LocalHost)
	if err != nil || vm == nil {
		return err
	}
	a.opts.Env = vm.Env
	if a.opts.Proxy.ServiceCluster == "" {
		a.opts.Proxy.ServiceCluster = vm.ServiceCluster
	}
	a.log.Info("Istio VM: environment from its env files, as istio-start.sh", "files", vm.Files,
		"namespace", a.opts.getenv("POD_NAMESPACE"), "instance_ip", a.opts.getenv("INSTANCE_IP"), "ca_addr", a.opts.getenv("CA_ADDR"))
	for _, path := range vm.Missing {
		a.log.Warn("Istio VM file missing: onboarding installs it", "path", path)
	}
	if v := a.opts.getenv("ISTIO_AGENT_FLAGS"); v != "" {
		a.log.Warn("ISTIO_AGENT_FLAGS is not read: put pilot-agent's flags on agentd's command line", "flags", v)
	}
	return nil
}
