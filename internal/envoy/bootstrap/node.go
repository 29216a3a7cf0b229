package bootstrap

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	meshv1 "istio.io/api/mesh/v1alpha1"
)

// ProxyType is the kind of proxy, the argument of `pilot-agent proxy`.
type ProxyType string

// The proxy types agentd runs.
const (
	Sidecar ProxyType = "sidecar"
	Router  ProxyType = "router"
)

// ParseProxyType accepts Istio's proxy types that agentd supports; "" is a sidecar.
func ParseProxyType(s string) (ProxyType, error) {
	switch ProxyType(s) {
	case "", Sidecar:
		return Sidecar, nil
	case Router:
		return Router, nil
	case "waypoint", "ztunnel", "agentgateway":
		return "", fmt.Errorf("proxy type %q is not supported by agentd (sidecar or router)", s)
	}
	return "", fmt.Errorf("invalid proxy type %q (sidecar or router)", s)
}

// Config is the typed input of the bootstrap and of Envoy's command line: everything
// pilot-agent derives from its flags, environment and pod files, already resolved.
type Config struct {
	Type           ProxyType
	PodName        string   // POD_NAME (required)
	PodNamespace   string   // POD_NAMESPACE (required)
	ServiceAccount string   // SERVICE_ACCOUNT
	Domain         string   // --domain; default <namespace>.svc.cluster.local
	IPs            []string // INSTANCE_IP first, then the host's other IPs (see ProxyIPs)

	ProxyConfig *meshv1.ProxyConfig // the merged ProxyConfig (see MergeProxyConfig)
	Labels      map[string]string   // the pod's labels file (etc/istio/pod/labels)
	Annotations map[string]string   // the pod's annotations file (etc/istio/pod/annotations)
	// Env is the environment, scanned for ISTIO_META_<K>=v (metadata K: v) and
	// ISTIO_METAJSON_<K>=<json object> (merged into the metadata).
	Env []string

	IstioVersion                string   // ISTIO_VERSION metadata
	DeltaXDS                    bool     // ISTIO_DELTA_XDS: DELTA_GRPC instead of GRPC for ADS
	DualStack                   bool     // ISTIO_DUAL_STACK
	ExitOnZeroActiveConnections bool     // EXIT_ON_ZERO_ACTIVE_CONNECTIONS
	MetadataDiscovery           bool     // METADATA_DISCOVERY (needs DeltaXDS)
	EnvoyStatusPort             int      // ENVOY_STATUS_PORT; 0 means 15021
	EnvoyPrometheusPort         int      // ENVOY_PROMETHEUS_PORT; 0 means 15090
	SDSSocket                   string   // Envoy's sds-grpc path; "" means Istio's
	OutlierLogPath              string   // --outlierLogPath
	StsPort                     int      // --stsPort (metadata only)
	PilotSAN                    []string // PILOT_SAN metadata
	XDSRootCA                   string   // XDS_ROOT_CA metadata
	DNSProxyAddr                string   // DNS_PROXY_ADDR metadata
}

// DefaultSDSSocket is where Envoy finds the workload SDS server (relative to the root).
const DefaultSDSSocket = "./var/run/secrets/workload-spiffe-uds/socket"

func (c *Config) statusPort() int     { return orDefault(c.EnvoyStatusPort, 15021) }
func (c *Config) prometheusPort() int { return orDefault(c.EnvoyPrometheusPort, 15090) }

func orDefault(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

// domain is the DNS domain of the node id.
func (c *Config) domain() string {
	if c.Domain != "" {
		return c.Domain
	}
	return c.PodNamespace + ".svc.cluster.local"
}

// Check reports what is missing or wrong in the input before anything is generated.
func (c *Config) Check() error {
	var errs []error
	if _, err := ParseProxyType(string(c.Type)); err != nil {
		errs = append(errs, err)
	}
	if c.PodName == "" {
		errs = append(errs, errors.New("POD_NAME is not set: the node id <type>~<ip>~<pod>.<namespace>~<domain> needs it"))
	}
	if c.PodNamespace == "" {
		errs = append(errs, errors.New("POD_NAMESPACE is not set: the node id <type>~<ip>~<pod>.<namespace>~<domain> needs it"))
	}
	if len(c.IPs) == 0 {
		errs = append(errs, errors.New("no proxy IP address (INSTANCE_IP or a host interface)"))
	}
	for _, ip := range c.IPs {
		if _, err := netip.ParseAddr(ip); err != nil {
			errs = append(errs, fmt.Errorf("proxy IP %q: %w", ip, err))
		}
	}
	if c.ProxyConfig == nil {
		errs = append(errs, errors.New("no ProxyConfig"))
	} else if err := ValidateProxyConfig(c.ProxyConfig); err != nil {
		errs = append(errs, fmt.Errorf("invalid ProxyConfig: %w", err))
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"ENVOY_STATUS_PORT", c.EnvoyStatusPort}, {"ENVOY_PROMETHEUS_PORT", c.EnvoyPrometheusPort}} {
		if p.v < 0 || p.v > math.MaxUint16 { // 0 is the default port
			errs = append(errs, fmt.Errorf("%s %d: must be a port in 1-65535", p.name, p.v))
		}
	}
	if c.MetadataDiscovery && !c.DeltaXDS {
		errs = append(errs, errors.New("METADATA_DISCOVERY needs delta xDS (ISTIO_DELTA_XDS=true)"))
	}
	return errors.Join(errs...)
}

// NodeID is Istio's node id: <type>~<first IP>~<pod>.<namespace>~<domain>.
func (c *Config) NodeID() string {
	ip := ""
	if len(c.IPs) > 0 {
		ip = c.IPs[0]
	}
	return fmt.Sprintf("%s~%s~%s.%s~%s", c.Type, ip, c.PodName, c.PodNamespace, c.domain())
}

// Node is the bootstrap's node: id, service cluster, locality and Istio's metadata.
func (c *Config) Node() (*corev3.Node, error) {
	meta, labels, err := c.metadata()
	if err != nil {
		return nil, err
	}
	st, err := structpb.NewStruct(meta)
	if err != nil {
		return nil, fmt.Errorf("node metadata: %w", err)
	}
	return &corev3.Node{
		Id:       c.NodeID(),
		Cluster:  serviceCluster(c.ProxyConfig, labels, c.PodNamespace, stringOf(meta["WORKLOAD_NAME"])),
		Locality: locality(labels),
		Metadata: st,
	}, nil
}

const (
	metaPrefix     = "ISTIO_META_"
	metaJSONPrefix = "ISTIO_METAJSON_"
	localityLabel  = "topology.istio.io/locality"
	legacyLocality = "istio-locality"
)

// metadata builds the node metadata as Istio's GetNodeMetaData and ConvertNodeToXDSNode do:
// proxyMetadata ISTIO_META_ keys, ISTIO_META_* and ISTIO_METAJSON_* variables, then the
// typed keys agentd knows, which win. It also returns the effective labels.
func (c *Config) metadata() (map[string]any, map[string]string, error) {
	meta := map[string]any{}
	for k, v := range c.ProxyConfig.GetProxyMetadata() {
		if name, ok := strings.CutPrefix(k, metaPrefix); ok {
			meta[name] = v
		}
	}
	for _, kv := range c.Env {
		if rest, ok := strings.CutPrefix(kv, metaPrefix); ok {
			if k, v, ok := strings.Cut(rest, "="); ok {
				meta[k] = v
			}
		}
	}
	var staticLabels map[string]string
	for _, kv := range c.Env {
		rest, ok := strings.CutPrefix(kv, metaJSONPrefix)
		if !ok {
			continue
		}
		k, v, ok := strings.Cut(rest, "=")
		if !ok {
			continue
		}
		// Istio ignores the variable's name and merges the object into the metadata.
		if err := json.Unmarshal([]byte(v), &meta); err != nil {
			return nil, nil, fmt.Errorf("%s%s is not a JSON object: %w", metaJSONPrefix, k, err)
		}
		if k == "LABELS" {
			if err := json.Unmarshal([]byte(v), &staticLabels); err != nil {
				return nil, nil, fmt.Errorf("%sLABELS is not a JSON object of strings: %w", metaJSONPrefix, err)
			}
		}
	}

	labels := map[string]string{}
	for k, v := range staticLabels {
		labels[k] = v
	}
	for k, v := range c.Labels {
		if k != "pod-template-hash" {
			labels[k] = v
		}
	}
	if l := labels[localityLabel]; l != "" {
		labels[localityLabel] = strings.ReplaceAll(l, ".", "/")
	}

	pcJSON, err := protojson.Marshal(c.ProxyConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("encode ProxyConfig: %w", err)
	}
	var pc map[string]any
	if err := json.Unmarshal(pcJSON, &pc); err != nil {
		return nil, nil, fmt.Errorf("encode ProxyConfig: %w", err)
	}

	typed := map[string]any{
		"INSTANCE_IPS":          strings.Join(dedup(c.IPs), ","),
		"NAMESPACE":             c.PodNamespace,
		"NAME":                  c.PodName,
		"SERVICE_ACCOUNT":       c.ServiceAccount,
		"ISTIO_VERSION":         c.IstioVersion,
		"ENVOY_STATUS_PORT":     c.statusPort(),
		"ENVOY_PROMETHEUS_PORT": c.prometheusPort(),
		"PROXY_CONFIG":          pc,
		"OUTLIER_LOG_PATH":      c.OutlierLogPath,
		"XDS_ROOT_CA":           c.XDSRootCA,
		"DNS_PROXY_ADDR":        c.DNSProxyAddr,
	}
	if v, ok := meta["ISTIO_VERSION"]; ok && c.IstioVersion == "" {
		typed["ISTIO_VERSION"] = v
	}
	if len(labels) > 0 {
		typed["LABELS"] = stringMap(labels)
	}
	if len(c.Annotations) > 0 {
		typed["ANNOTATIONS"] = stringMap(c.Annotations)
	}
	if len(c.PilotSAN) > 0 {
		typed["PILOT_SAN"] = stringList(c.PilotSAN)
	}
	if c.StsPort != 0 {
		typed["STS_PORT"] = strconv.Itoa(c.StsPort)
	}
	if c.ExitOnZeroActiveConnections {
		typed["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"] = "true"
	}
	if c.MetadataDiscovery {
		typed["METADATA_DISCOVERY"] = "true"
	}
	for k, v := range typed {
		if s, ok := v.(string); ok && s == "" {
			continue // omitempty, as Istio's typed metadata
		}
		meta[k] = v
	}
	return meta, labels, nil
}

func stringMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func stringList(l []string) []any {
	out := make([]any, len(l))
	for i, v := range l {
		out[i] = v
	}
	return out
}

func stringOf(v any) string {
	s, _ := v.(string)
	return s
}

func dedup(l []string) []string {
	var out []string
	for _, v := range l {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// locality parses the locality label (region/zone/subzone); nil when there is none.
func locality(labels map[string]string) *corev3.Locality {
	l := labels[localityLabel]
	if l == "" {
		l = strings.ReplaceAll(labels[legacyLocality], ".", "/")
	}
	if l == "" {
		return nil
	}
	parts := strings.SplitN(l, "/", 3)
	loc := &corev3.Locality{Region: parts[0]}
	if len(parts) > 1 {
		loc.Zone = parts[1]
	}
	if len(parts) > 2 {
		loc.SubZone = parts[2]
	}
	return loc
}

// serviceCluster is the node's cluster, as Istio's getServiceCluster.
func serviceCluster(pc *meshv1.ProxyConfig, labels map[string]string, ns, workload string) string {
	orDefault := func(name string) string {
		if name != "" && name != "istio-proxy" {
			return name
		}
		if app, ok := labels["app"]; ok {
			return app + "." + ns
		}
		if workload != "" {
			return workload + "." + ns
		}
		if ns != "" {
			return "istio-proxy." + ns
		}
		return "istio-proxy"
	}
	switch n := pc.GetClusterName().(type) {
	case *meshv1.ProxyConfig_ServiceCluster:
		return orDefault(n.ServiceCluster)
	case *meshv1.ProxyConfig_TracingServiceName_:
		if workload == "" {
			workload = "istio-proxy"
		}
		switch n.TracingServiceName {
		case meshv1.ProxyConfig_CANONICAL_NAME_ONLY:
			return orDefault(canonicalService(labels, workload))
		case meshv1.ProxyConfig_CANONICAL_NAME_AND_NAMESPACE:
			if ns != "" {
				return canonicalService(labels, workload) + "." + ns
			}
			return orDefault(canonicalService(labels, workload))
		}
	}
	return orDefault("istio-proxy")
}

// canonicalService is the workload's canonical service name from its labels.
func canonicalService(labels map[string]string, workload string) string {
	for _, k := range []string{"service.istio.io/canonical-name", "app.kubernetes.io/name", "app"} {
		if v := labels[k]; v != "" {
			return v
		}
	}
	return workload
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ProxyIPs is pilot-agent's list of the proxy's addresses: instanceIP (INSTANCE_IP) first,
// then the host's other addresses that are not loopback, link-local or unspecified, minus
// those of the excluded interfaces (annotation traffic.sidecar.istio.io/excludeInterfaces);
// 127.0.0.1 and ::1 stand for the host's when it has none.
func ProxyIPs(instanceIP string, excludeInterfaces []string) []string {
	var ips []string
	if a, err := netip.ParseAddr(instanceIP); err == nil {
		ips = append(ips, a.String())
	}
	excluded := map[string]bool{}
	for _, name := range excludeInterfaces {
		for _, a := range interfaceAddrs(name) {
			excluded[a.String()] = true
		}
	}
	var host []string
	for _, a := range interfaceAddrs("") {
		if !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast() && !a.IsUnspecified() {
			host = append(host, a.String())
		}
	}
	if len(host) == 0 {
		host = []string{"127.0.0.1", "::1"}
	}
	for _, a := range host {
		if !excluded[a] && !slices.Contains(ips, a) {
			ips = append(ips, a)
		}
	}
	return ips
}

// interfaceAddrs lists the addresses of one interface, or of all when name is "".
func interfaceAddrs(name string) []netip.Addr {
	var ifaces []net.Interface
	if name == "" {
		ifaces, _ = net.Interfaces()
	} else if ifc, err := net.InterfaceByName(name); err == nil {
		ifaces = []net.Interface{*ifc}
	}
	var out []netip.Addr
	for _, ifc := range ifaces {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				out = append(out, p.Addr().Unmap())
			}
		}
	}
	return out
}
