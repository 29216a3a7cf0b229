package bootstrap

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/agentd/agentd/internal/buildinfo"
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
	// Env is the environment, scanned for ISTIO_META_<K>=v (metadata K: v),
	// ISTIO_METAJSON_<K>=<json object> (merged into the metadata) and HOST_IP (which replaces
	// $(HOST_IP) in the tracer and metrics service addresses).
	Env []string

	// IstioVersion is the Istio release of the proxy image, ISTIO_VERSION in the metadata;
	// "" means buildinfo.IstioVersion. An ISTIO_META_ISTIO_VERSION overrides it, as in Istio.
	IstioVersion                string
	DeltaXDS                    bool     // ISTIO_DELTA_XDS: DELTA_GRPC instead of GRPC for ADS
	DualStack                   bool     // ISTIO_DUAL_STACK
	ExitOnZeroActiveConnections bool     // EXIT_ON_ZERO_ACTIVE_CONNECTIONS
	MetadataDiscovery           bool     // METADATA_DISCOVERY (used with delta xDS only)
	SkipDeprecatedLogs          bool     // ENVOY_SKIP_DEPRECATED_LOGS (Istio's default: true)
	EnvoyStatusPort             int      // ENVOY_STATUS_PORT; 0 means 15021
	EnvoyPrometheusPort         int      // ENVOY_PROMETHEUS_PORT; 0 means 15090
	StatusPortProxyProtocol     bool     // ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL
	LogAsJSON                   bool     // --log_as_json: Envoy's application log in JSON
	WorkloadIdentitySocketFile  string   // WORKLOAD_IDENTITY_SOCKET_FILE; "" means "socket"
	CredentialSocket            bool     // a credential SDS socket exists: "credential" metadata
	FileCredentials             bool     // sds-server serves file certificates only: sds-files-grpc
	OutlierLogPath              string   // --outlierLogPath
	StsPort                     int      // --stsPort (metadata only)
	PilotSAN                    []string // PILOT_SAN metadata, with controlPlaneAuthPolicy MUTUAL_TLS only
	DNSProxyAddr                string   // DNS_PROXY_ADDR metadata

	// Warn, when set, receives what Istio logs as a warning and goes on from (a bad
	// ISTIO_METAJSON_ variable, an annotation that does not parse).
	Warn func(msg string, args ...any)
}

// DefaultSDSSocket is where Envoy finds the workload SDS server (relative to the root).
const DefaultSDSSocket = sdsSocketDir + "socket"

// Istio's socket paths, relative to the root.
const (
	sdsSocketDir         = "./var/run/secrets/workload-spiffe-uds/"
	fileCredentialSocket = "./var/run/secrets/credential-uds/files-socket"
)

// sdsSocketFile is the file name of the workload SDS socket in sdsSocketDir.
func (c *Config) sdsSocketFile() string {
	if c.WorkloadIdentitySocketFile != "" {
		return c.WorkloadIdentitySocketFile
	}
	return "socket"
}

func (c *Config) warn(msg string, args ...any) {
	if c.Warn != nil {
		c.Warn(msg, args...)
	}
}

// getenv is the last value of key in c.Env.
func (c *Config) getenv(key string) string {
	v := ""
	for _, kv := range c.Env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

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
	if f := c.WorkloadIdentitySocketFile; f != "" && f != filepath.Base(f) {
		errs = append(errs, fmt.Errorf("WORKLOAD_IDENTITY_SOCKET_FILE %q: must be a file name, not a path", f))
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
	m, err := c.nodeMetadata()
	if err != nil {
		return nil, err
	}
	st, err := structpb.NewStruct(m.meta)
	if err != nil {
		return nil, fmt.Errorf("node metadata: %w", err)
	}
	return &corev3.Node{
		Id:       c.NodeID(),
		Cluster:  serviceCluster(c.ProxyConfig, m.labels, c.PodNamespace, stringOf(m.meta["WORKLOAD_NAME"])),
		Locality: m.locality,
		Metadata: st,
	}, nil
}

// GRPCNode is the node of the gRPC xDS bootstrap, as Istio writes it: only the metadata keys
// Istio's typed metadata knows (the untyped ISTIO_META_* and ISTIO_METAJSON_* keys are left
// out there).
func (c *Config) GRPCNode() (*corev3.Node, error) {
	n, err := c.Node()
	if err != nil {
		return nil, err
	}
	for k, v := range n.Metadata.GetFields() {
		if !slices.Contains(typedMetadataKeys, k) || slices.Contains(stringBoolKeys, k) && v.GetStringValue() != "true" {
			delete(n.Metadata.Fields, k)
		}
	}
	return n, nil
}

// typedMetadataKeys are the JSON names of Istio's typed node metadata (BootstrapNodeMetadata).
var typedMetadataKeys = []string{
	"PROXY_CONFIG", "ISTIO_VERSION", "ISTIO_REVISION", "LABELS", "STATIC_LABELS", "ANNOTATIONS", "INSTANCE_IPS",
	"NAMESPACE", "NODE_NAME", "WORKLOAD_NAME", "INTERCEPTION_MODE", "SERVICE_ACCOUNT", "HTTP_PROXY_PORT", "MESH_ID",
	"CLUSTER_ID", "NETWORK", "REQUESTED_NETWORK_VIEW", "POD_PORTS", "TLS_SERVER_CERT_CHAIN", "TLS_SERVER_KEY",
	"TLS_SERVER_ROOT_CERT", "TLS_CLIENT_CERT_CHAIN", "TLS_CLIENT_KEY", "TLS_CLIENT_ROOT_CERT", "BASE", "IDLE_TIMEOUT",
	"HTTP10", "GENERATOR", "ENABLE_SELF_DISCOVERY", "DNS_CAPTURE", "DNS_AUTO_ALLOCATE", "DNS_PROXY_ADDR", "ENABLE_HBONE",
	"DISABLE_HBONE_SEND", "AUTO_REGISTER_GROUP", "WORKLOAD_ENTRY", "UNPRIVILEGED_POD", "PLATFORM_METADATA", "STS_PORT",
	"ENVOY_STATUS_PORT", "ENVOY_PROMETHEUS_PORT", "ENVOY_SECURE_METRICS_PORT", "ENVOY_SECURE_MERGED_METRICS_PORT",
	"EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "INBOUND_LISTENER_EXACT_BALANCE", "OUTBOUND_LISTENER_EXACT_BALANCE",
	"CLOUDRUN_ADDR", "METADATA_DISCOVERY", "ENVOY_SKIP_DEPRECATED_LOGS", "WORKLOAD_IDENTITY_SOCKET_FILE",
	"NAME", "OWNER", "PILOT_SAN", "OUTLIER_LOG_PATH", "APP_CONTAINERS", "ISTIO_PROXY_SHA",
}

const (
	metaPrefix     = "ISTIO_META_"
	metaJSONPrefix = "ISTIO_METAJSON_"
	localityLabel  = "topology.istio.io/locality"
	legacyLocality = "istio-locality"
)

// stringBoolKeys are the metadata keys Istio types as booleans written as "true"/"false":
// a value that is not a boolean fails.
var stringBoolKeys = []string{
	"ENABLE_SELF_DISCOVERY", "DNS_CAPTURE", "DNS_AUTO_ALLOCATE", "ENABLE_HBONE", "DISABLE_HBONE_SEND",
	"INBOUND_LISTENER_EXACT_BALANCE", "OUTBOUND_LISTENER_EXACT_BALANCE",
}

// nodeMeta is the node's metadata with what the bootstrap derives from it.
type nodeMeta struct {
	meta     map[string]any
	labels   map[string]string // the effective labels (LABELS)
	locality *corev3.Locality  // never nil: Istio writes "locality": {} without one
}

// nodeMetadata builds the metadata as Istio's generateNodeMetadata (GetNodeMetaData) does:
// the untyped keys of proxyMetadata ISTIO_META_*, the ISTIO_META_* and ISTIO_METAJSON_*
// variables and DNS_PROXY_ADDR, read into Istio's typed metadata (which normalises some of
// them), then the typed keys agentd sets, which win over the untyped ones.
func (c *Config) nodeMetadata() (nodeMeta, error) {
	raw := c.untypedMetadata()
	meta := map[string]any{}
	for k, v := range raw {
		meta[k] = v
	}
	if err := normaliseTyped(meta); err != nil {
		return nodeMeta{}, err
	}
	static, labels, loc := c.labels()
	typed, err := c.typedMetadata(raw, meta, static, labels)
	if err != nil {
		return nodeMeta{}, err
	}
	for k, v := range typed {
		if s, ok := v.(string); ok && s == "" {
			continue // omitempty, as Istio's typed metadata; an untyped value stays
		}
		meta[k] = v
	}
	if c.CredentialSocket {
		meta["credential"] = "true"
	}
	if c.FileCredentials {
		meta["file-credential"] = "true"
	}
	return nodeMeta{meta: meta, labels: labels, locality: parseLocality(loc)}, nil
}

// labels are Istio's: the static labels (ISTIO_METAJSON_LABELS), the pod's over them
// (without pod-template-hash), and the locality label, sanitised ("." as "/") and written
// back under istio-locality, as Istio does.
func (c *Config) labels() (static, labels map[string]string, locality string) {
	if v := c.getenv(metaJSONPrefix + "LABELS"); v != "" {
		if err := json.Unmarshal([]byte(v), &static); err != nil {
			c.warn("ISTIO_METAJSON_LABELS is not a JSON object of strings", "error", err)
			static = nil
		}
	}
	labels = map[string]string{}
	for k, v := range static {
		labels[k] = v
	}
	for k, v := range c.Labels {
		if k != "pod-template-hash" {
			labels[k] = v
		}
	}
	loc, ok := labels[localityLabel]
	if !ok {
		loc = labels[legacyLocality]
	}
	if loc != "" && !strings.Contains(loc, "/") {
		loc = strings.ReplaceAll(loc, ".", "/")
	}
	if loc != "" {
		labels[legacyLocality] = loc
	}
	return static, labels, loc
}

// typedMetadata are the keys of Istio's typed metadata agentd sets; they win over the
// untyped ones (raw as given, meta normalised).
func (c *Config) typedMetadata(raw, meta map[string]any, static, labels map[string]string) (map[string]any, error) {
	pc, err := proxyConfigJSON(c.ProxyConfig)
	if err != nil {
		return nil, err
	}
	version := stringOf(meta["ISTIO_VERSION"])
	if version == "" {
		version = c.IstioVersion
	}
	if version == "" {
		version = buildinfo.IstioVersion
	}
	discovery := c.MetadataDiscovery
	if _, set := raw["METADATA_DISCOVERY"]; !set && !discovery {
		discovery = meta["ENABLE_HBONE"] == "true" // Istio: on with ambient's HBONE
	}
	typed := map[string]any{
		"ISTIO_VERSION":                 version,
		"INSTANCE_IPS":                  strings.Join(dedup(c.IPs), ","),
		"NAMESPACE":                     c.PodNamespace,
		"NAME":                          c.PodName,
		"SERVICE_ACCOUNT":               c.ServiceAccount,
		"ENVOY_STATUS_PORT":             c.statusPort(),
		"ENVOY_PROMETHEUS_PORT":         c.prometheusPort(),
		"PROXY_CONFIG":                  pc,
		"OUTLIER_LOG_PATH":              c.OutlierLogPath,
		"DNS_PROXY_ADDR":                c.DNSProxyAddr,
		"METADATA_DISCOVERY":            strconv.FormatBool(discovery),
		"WORKLOAD_IDENTITY_SOCKET_FILE": c.sdsSocketFile(),
	}
	if c.StsPort != 0 {
		typed["STS_PORT"] = strconv.Itoa(c.StsPort)
	}
	if c.ExitOnZeroActiveConnections {
		typed["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"] = "true"
	}
	if c.SkipDeprecatedLogs {
		typed["ENVOY_SKIP_DEPRECATED_LOGS"] = "true"
	}
	if len(labels) > 0 {
		typed["LABELS"] = stringMap(labels)
	}
	if len(static) > 0 {
		typed["STATIC_LABELS"] = stringMap(static)
	}
	annos := map[string]string{}
	if m, ok := meta["ANNOTATIONS"].(map[string]any); ok {
		for k, v := range m {
			annos[k] = stringOf(v)
		}
	}
	for k, v := range c.Annotations {
		annos[k] = v
	}
	if len(annos) > 0 {
		typed["ANNOTATIONS"] = stringMap(annos)
	}
	if len(c.PilotSAN) > 0 && c.ProxyConfig.GetControlPlaneAuthPolicy() == meshv1.AuthenticationPolicy_MUTUAL_TLS {
		typed["PILOT_SAN"] = stringList(c.PilotSAN)
	}
	return typed, nil
}

// untypedMetadata is Istio's untyped metadata: proxyMetadata ISTIO_META_ keys, then the
// ISTIO_META_* variables, then each ISTIO_METAJSON_* object merged in (its name ignored; one
// that does not parse is warned about and skipped), then DNS_PROXY_ADDR.
func (c *Config) untypedMetadata() map[string]any {
	raw := map[string]any{}
	for k, v := range c.ProxyConfig.GetProxyMetadata() {
		if name, ok := strings.CutPrefix(k, metaPrefix); ok {
			raw[name] = v
		}
	}
	for _, kv := range c.Env {
		if rest, ok := strings.CutPrefix(kv, metaPrefix); ok {
			if k, v, ok := strings.Cut(rest, "="); ok {
				raw[k] = v
			}
		}
	}
	for _, kv := range c.Env {
		rest, ok := strings.CutPrefix(kv, metaJSONPrefix)
		if !ok {
			continue
		}
		k, v, ok := strings.Cut(rest, "=")
		if !ok {
			continue
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(v), &obj); err != nil {
			c.warn("ignoring an ISTIO_METAJSON_ variable that is not a JSON object, as Istio does", "name", metaJSONPrefix+k, "error", err)
			continue
		}
		for ok, ov := range obj {
			raw[ok] = ov
		}
	}
	if c.DNSProxyAddr != "" {
		raw["DNS_PROXY_ADDR"] = c.DNSProxyAddr
	}
	return raw
}

// normaliseTyped rewrites the untyped keys Istio reads into typed fields as Istio writes
// them back: a true boolean as "true" (a false one stays as given), POD_PORTS compacted. A value Istio cannot
// read fails, as it fails pilot-agent's start.
func normaliseTyped(meta map[string]any) error {
	for _, k := range stringBoolKeys {
		v, ok := meta[k]
		if !ok {
			continue
		}
		b, err := strconv.ParseBool(stringOf(v))
		if err != nil {
			return fmt.Errorf("node metadata %s=%v: not a boolean", k, v)
		}
		if b {
			meta[k] = "true"
		} // false: the typed key is left out and Istio writes the untyped value back, as given
	}
	if v, ok := meta["POD_PORTS"]; ok {
		s, isString := v.(string)
		var ports []struct {
			Name          string `json:"name,omitempty"`
			ContainerPort int    `json:"containerPort"`
			Protocol      string `json:"protocol"`
		}
		if !isString || json.Unmarshal([]byte(s), &ports) != nil {
			return fmt.Errorf("node metadata POD_PORTS=%v: not a JSON list of ports", v)
		}
		if len(ports) > 0 { // an empty list stays as given, as with Istio
			b, _ := json.Marshal(ports)
			meta["POD_PORTS"] = string(b)
		}
	}
	return nil
}

// proxyConfigJSON is the ProxyConfig as the metadata's PROXY_CONFIG object.
func proxyConfigJSON(pc *meshv1.ProxyConfig) (map[string]any, error) {
	b, err := protojson.Marshal(pc)
	if err != nil {
		return nil, fmt.Errorf("encode ProxyConfig: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("encode ProxyConfig: %w", err)
	}
	return m, nil
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

// parseLocality splits region/zone/subzone; empty without a locality.
func parseLocality(l string) *corev3.Locality {
	if l == "" {
		return &corev3.Locality{}
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
	for _, a := range upInterfaceAddrs() {
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

// upInterfaceAddrs lists the addresses of the interfaces that are up and not loopback, as
// Istio's GetPrivateIPs.
func upInterfaceAddrs() []netip.Addr {
	ifaces, _ := net.Interfaces()
	var out []netip.Addr
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		out = append(out, interfaceAddrs(ifc.Name)...)
	}
	return out
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
