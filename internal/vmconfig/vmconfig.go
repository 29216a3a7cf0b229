// Package vmconfig gives agentd the environment Istio's istio-start.sh gives pilot-agent on a
// virtual machine: sidecar.env and cluster.env (shell KEY=VALUE files) and the defaults the
// script derives from them.
package vmconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// Istio's VM files, relative to the root ("/" on a VM). ISTIO_SIDECAR_CONFIG and
// ISTIO_CLUSTER_CONFIG name other env files, as in istio-start.sh.
const (
	SidecarEnv = "var/lib/istio/envoy/sidecar.env"
	ClusterEnv = "var/lib/istio/envoy/cluster.env"
	// MeshConfig, RootCert and Token are read by agentd's children at Istio's paths; they are
	// listed here so that a VM missing one is told at start.
	MeshConfig = "etc/istio/config/mesh"
	RootCert   = "etc/certs/root-cert.pem"
	Token      = "var/run/secrets/tokens/istio-token"
	// certDir is istio-start.sh's default PROV_CERT and OUTPUT_CERTS.
	certDir = "etc/certs"
)

// Host is what istio-start.sh asks the machine: its short host name (`hostname -s`) and its
// first address (`hostname --all-ip-addresses`).
type Host struct {
	Name string
	IP   string
}

// VM is a VM's configuration as istio-start.sh hands it to pilot-agent.
type VM struct {
	// Env is the environment pilot-agent runs with: the process's, then sidecar.env and
	// cluster.env (a file's value wins, as when the script sources it), then the script's
	// defaults (POD_NAMESPACE, POD_NAME, INSTANCE_IP, CA_ADDR, PROV_CERT, OUTPUT_CERTS,
	// PROXY_CONFIG).
	Env []string
	// ServiceCluster is the script's --serviceCluster (ISTIO_SERVICE, default rawvm).
	ServiceCluster string
	// Files are the env files read, in order.
	Files []string
	// Missing are the VM files Istio's onboarding installs that are not there.
	Missing []string
}

// Load reads the VM configuration under root. It returns nil when there is no cluster.env:
// the machine is not an Istio VM and nothing changes. host is called only for the defaults
// it provides.
func Load(root string, env []string, host func() Host) (*VM, error) {
	vars := newEnv(env)
	sidecar := envFile(root, vars.get("ISTIO_SIDECAR_CONFIG"), SidecarEnv)
	cluster := envFile(root, vars.get("ISTIO_CLUSTER_CONFIG"), ClusterEnv)
	if _, err := os.Stat(cluster); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	vm := &VM{}
	for _, path := range []string{sidecar, cluster} {
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) && path == sidecar {
			continue // optional, as in the script
		}
		if err != nil {
			return nil, fmt.Errorf("read VM env file: %w", err)
		}
		kvs, err := ParseEnvFile(string(data))
		if err != nil {
			return nil, fmt.Errorf("VM env file %s: %w", path, err)
		}
		for _, kv := range kvs {
			vars.set(kv[0], kv[1])
		}
		vm.Files = append(vm.Files, path)
	}
	vm.ServiceCluster = vars.getOr("ISTIO_SERVICE", "rawvm")
	applyDefaults(vars, root, vm.ServiceCluster, host)
	vm.Env = vars.list()
	for _, p := range []string{MeshConfig, RootCert, Token} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			vm.Missing = append(vm.Missing, filepath.Join(root, p))
		}
	}
	return vm, nil
}

// applyDefaults sets what istio-start.sh sets before it runs `pilot-agent proxy`.
func applyDefaults(vars *env, root, serviceCluster string, host func() Host) {
	pilot := vars.get("PILOT_ADDRESS")
	if pilot == "" {
		pilot = "istiod." + vars.getOr("ISTIO_SYSTEM_NAMESPACE", "istio-system") + ".svc:" + vars.getOr("ISTIO_PILOT_PORT", "15012")
	}
	var h *Host
	lookup := func() Host {
		if h == nil {
			v := host()
			h = &v
		}
		return *h
	}
	// The script runs pilot-agent with these three set, whatever the environment had.
	vars.set("POD_NAMESPACE", vars.getOr("ISTIO_NAMESPACE", "default"))
	if vars.get("POD_NAME") == "" {
		vars.set("POD_NAME", lookup().Name)
	}
	ip := vars.get("ISTIO_SVC_IP")
	if ip == "" {
		ip = lookup().IP
	}
	vars.set("INSTANCE_IP", ip)
	if vars.get("CA_ADDR") == "" {
		vars.set("CA_ADDR", pilot)
	}
	// ${PROV_CERT-/etc/certs}: an empty value is kept, only an unset one gets the default.
	for _, k := range []string{"PROV_CERT", "OUTPUT_CERTS"} {
		if !vars.has(k) {
			vars.set(k, filepath.Join(root, certDir))
		}
	}
	if vars.get("PROXY_CONFIG") == "" {
		vars.set("PROXY_CONFIG", fmt.Sprintf("\nserviceCluster: %s\ncontrolPlaneAuthPolicy: %s\ndiscoveryAddress: %s\n",
			serviceCluster, vars.getOr("ISTIO_CP_AUTH", "MUTUAL_TLS"), pilot))
	}
}

// envFile is the env file named by an ISTIO_*_CONFIG value, or the default under root.
func envFile(root, named, def string) string {
	if named == "" {
		return filepath.Join(root, def)
	}
	if filepath.IsAbs(named) {
		return named
	}
	return filepath.Join(root, named)
}

// env is an environment whose order is kept and whose later values win.
type env struct {
	keys []string
	vals map[string]string
}

func newEnv(kvs []string) *env {
	e := &env{vals: map[string]string{}}
	for _, kv := range kvs {
		if k, v, ok := strings.Cut(kv, "="); ok {
			e.set(k, v)
		}
	}
	return e
}

func (e *env) set(k, v string) {
	if _, ok := e.vals[k]; !ok {
		e.keys = append(e.keys, k)
	}
	e.vals[k] = v
}

func (e *env) has(k string) bool   { _, ok := e.vals[k]; return ok }
func (e *env) get(k string) string { return e.vals[k] }

func (e *env) getOr(k, def string) string {
	if v := e.vals[k]; v != "" {
		return v
	}
	return def
}

func (e *env) list() []string {
	out := make([]string, len(e.keys))
	for i, k := range e.keys {
		out[i] = k + "=" + e.vals[k]
	}
	return out
}

// LocalHost is this machine's Host: `hostname -s`, and the first address `hostname
// --all-ip-addresses` prints (neither loopback nor link-local).
func LocalHost() Host {
	var h Host
	if name, err := os.Hostname(); err == nil {
		h.Name, _, _ = strings.Cut(name, ".")
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		if ip := p.Addr().Unmap(); !ip.IsLoopback() && !ip.IsLinkLocalUnicast() && !ip.IsUnspecified() {
			h.IP = ip.String()
			break
		}
	}
	return h
}
