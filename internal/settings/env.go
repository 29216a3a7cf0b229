package settings

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Env is the table of every environment variable agentd reads, one field each: the variable
// (env), Istio's default (envDefault), the processes whose configuration it changes (to:
// agentd, envoy, xds-proxy, sds-server, dns-proxy, prober), and Istio's behaviour on a value
// that does not parse (bad: warn, Istio's env package logs and uses the default, or refuse).
// Resolve parses it once (github.com/caarlos0/env); TestEveryVariableReachesItsProcesses
// proves each row reaches the processes it names. Variables read by prefix are in Prefixes;
// the pilot-agent variables agentd leaves alone are in Ignored, with why.
type Env struct {
	// The pod.
	PodName        string `env:"POD_NAME" to:"envoy" bad:"warn"`
	PodNamespace   string `env:"POD_NAMESPACE" to:"envoy,sds-server,dns-proxy" bad:"warn"`
	ServiceAccount string `env:"SERVICE_ACCOUNT" to:"envoy,sds-server" bad:"warn"`
	InstanceIP     string `env:"INSTANCE_IP" to:"envoy,prober" bad:"warn"`
	HostIP         string `env:"HOST_IP" to:"envoy" bad:"warn"` // $(HOST_IP) in ISTIO_BOOTSTRAP_OVERRIDE
	// KubernetesServiceHost tells a pod from a VM: certificates written out are world-readable
	// in a pod, as Istio's.
	KubernetesServiceHost string `env:"KUBERNETES_SERVICE_HOST" to:"sds-server" bad:"warn"`
	ClusterID             string `env:"ISTIO_META_CLUSTER_ID" to:"envoy,xds-proxy,sds-server" bad:"warn"`
	TrustDomain           string `env:"TRUST_DOMAIN" envDefault:"cluster.local" to:"sds-server" bad:"warn"`

	// ProxyConfig: PROXY_CONFIG, merged over the mesh file's defaultConfig (see Resolve). Istio
	// refuses one that does not parse.
	ProxyConfig  string `env:"PROXY_CONFIG" to:"envoy,xds-proxy,prober,agentd" bad:"refuse"`
	CPULimit     Count  `env:"ISTIO_CPU_LIMIT" to:"envoy" bad:"warn"` // fills an unset concurrency
	DisableEnvoy bool   `env:"DISABLE_ENVOY" to:"agentd" bad:"warn"`

	// Envoy and its bootstrap.
	DeltaXDS                bool `env:"ISTIO_DELTA_XDS" envDefault:"true" to:"envoy" bad:"warn"`
	DualStack               bool `env:"ISTIO_DUAL_STACK" to:"envoy" bad:"warn"`
	EnvoyStatusPort         Port `env:"ENVOY_STATUS_PORT" envDefault:"15021" to:"envoy" bad:"warn"`
	StatusPortProxyProtocol bool `env:"ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL" to:"envoy" bad:"warn"`
	// PeerMetadataDiscovery is the node's METADATA_DISCOVERY; unset, ISTIO_META_ENABLE_HBONE's.
	PeerMetadataDiscovery OptionalBool `env:"PEER_METADATA_DISCOVERY" to:"envoy" bad:"warn"`
	// BootstrapTemplate is Istio's older name of the bootstrap template's path.
	BootstrapTemplate           string   `env:"ISTIO_BOOTSTRAP" to:"envoy" bad:"warn"`
	EnvoyPrometheusPort         Port     `env:"ENVOY_PROMETHEUS_PORT" envDefault:"15090" to:"envoy,agentd" bad:"warn"`
	SkipDeprecatedLogs          bool     `env:"ENVOY_SKIP_DEPRECATED_LOGS" envDefault:"true" to:"envoy" bad:"warn"`
	EnableCoreDump              bool     `env:"ISTIO_ENVOY_ENABLE_CORE_DUMP" to:"envoy" bad:"warn"`
	BootstrapOverride           string   `env:"ISTIO_BOOTSTRAP_OVERRIDE" to:"envoy" bad:"warn"`
	ExitOnZeroActiveConnections bool     `env:"EXIT_ON_ZERO_ACTIVE_CONNECTIONS" to:"envoy" bad:"warn"`
	MinimumDrainDuration        Duration `env:"MINIMUM_DRAIN_DURATION" envDefault:"5s" to:"envoy" bad:"warn"`
	WorkloadIdentitySocketFile  string   `env:"WORKLOAD_IDENTITY_SOCKET_FILE" envDefault:"socket" to:"envoy,sds-server" bad:"refuse"`
	// agentd's own: the bound of the wait for zero connections (Istio has none), and Istio's
	// exit when Envoy exits instead of restarting it.
	MaxDrainDuration Duration `env:"AGENTD_MAX_DRAIN_DURATION" envDefault:"25s" to:"envoy" bad:"warn"`
	ExitOnEnvoyExit  bool     `env:"AGENTD_EXIT_ON_ENVOY_EXIT" to:"agentd" bad:"warn"`

	// The status server.
	PrometheusAnnotations string `env:"ISTIO_PROMETHEUS_ANNOTATIONS" to:"agentd" bad:"warn"`
	MergeEnvoyStats       bool   `env:"PILOT_AGENT_MERGE_ENVOY_STATS" envDefault:"true" to:"agentd" bad:"warn"`
	MetricsLocalhostOnly  bool   `env:"METRICS_LOCALHOST_ACCESS_ONLY" to:"agentd" bad:"warn"`

	// The control plane (xds-proxy) and the gRPC bootstrap of proxyless clients.
	IstiodSAN          string `env:"ISTIOD_SAN" to:"xds-proxy,sds-server" bad:"warn"`
	XDSRootCA          string `env:"XDS_ROOT_CA" to:"xds-proxy" bad:"warn"`
	ProvCert           string `env:"PROV_CERT" to:"xds-proxy,sds-server" bad:"warn"`
	PilotCertProvider  string `env:"PILOT_CERT_PROVIDER" envDefault:"istiod" to:"xds-proxy,sds-server" bad:"warn"`
	ProxyConfigXDS     bool   `env:"PROXY_CONFIG_XDS_AGENT" to:"xds-proxy" bad:"warn"`
	GRPCXDSBootstrap   string `env:"GRPC_XDS_BOOTSTRAP" envDefault:"etc/istio/proxy/grpc-bootstrap.json" to:"agentd" bad:"warn"`
	TLSClientCertChain string `env:"ISTIO_META_TLS_CLIENT_CERT_CHAIN" to:"xds-proxy,envoy" bad:"warn"`
	TLSClientKey       string `env:"ISTIO_META_TLS_CLIENT_KEY" to:"xds-proxy,envoy" bad:"warn"`
	TLSClientRootCert  string `env:"ISTIO_META_TLS_CLIENT_ROOT_CERT" to:"xds-proxy,envoy" bad:"warn"`

	// Wasm modules of ECDS (xds-proxy): fetched, verified, cached and rewritten to local files.
	WasmConversion     bool     `env:"ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION" envDefault:"true" to:"xds-proxy" bad:"warn"`
	WasmPurgeInterval  Duration `env:"WASM_PURGE_INTERVAL" envDefault:"1h" to:"xds-proxy" bad:"warn"`
	WasmModuleExpiry   Duration `env:"WASM_MODULE_EXPIRY" envDefault:"24h" to:"xds-proxy" bad:"warn"`
	WasmHTTPTimeout    Duration `env:"WASM_HTTP_REQUEST_TIMEOUT" envDefault:"15s" to:"xds-proxy" bad:"warn"`
	WasmHTTPMaxRetries Count    `env:"WASM_HTTP_REQUEST_MAX_RETRIES" envDefault:"5" to:"xds-proxy" bad:"warn"`
	WasmMaxBinarySize  Count    `env:"ISTIO_WASM_MAX_BINARY_SIZE_BYTES" envDefault:"268435456" to:"xds-proxy" bad:"warn"`
	WasmInsecure       string   `env:"WASM_INSECURE_REGISTRIES" to:"xds-proxy" bad:"warn"`    // comma-separated; * is every registry
	WasmBlockedCIDRs   string   `env:"BLOCKED_CIDRS_IN_WASM_FETCH" to:"xds-proxy" bad:"warn"` // comma-separated; xds-proxy warns about a bad one

	// Workload certificates (sds-server).
	CAAddr                 string   `env:"CA_ADDR" to:"sds-server" bad:"warn"`
	CARootCA               string   `env:"CA_ROOT_CA" to:"sds-server" bad:"warn"`
	CertSigner             string   `env:"ISTIO_META_CERT_SIGNER" to:"sds-server,envoy" bad:"warn"`
	SecretTTL              Duration `env:"SECRET_TTL" envDefault:"24h" to:"sds-server" bad:"warn"`
	FileDebounce           Duration `env:"FILE_DEBOUNCE_DURATION" envDefault:"100ms" to:"sds-server" bad:"warn"`
	GracePeriodRatio       Ratio    `env:"SECRET_GRACE_PERIOD_RATIO" envDefault:"0.5" to:"sds-server" bad:"warn"`
	GracePeriodRatioJitter Ratio    `env:"SECRET_GRACE_PERIOD_RATIO_JITTER" envDefault:"0.01" to:"sds-server" bad:"warn"`
	RSAKeySize             Count    `env:"WORKLOAD_RSA_KEY_SIZE" envDefault:"2048" to:"sds-server" bad:"warn"`
	PKCS8Key               bool     `env:"PKCS8_KEY" to:"sds-server" bad:"warn"`
	// Istio's CSRs all fail with another signature algorithm than ECDSA: agentd refuses it at
	// start, with the variable named. A curve other than P384 is P256, as in Istio.
	ECCSignatureAlgorithm SignatureAlgorithm `env:"ECC_SIGNATURE_ALGORITHM" to:"sds-server" bad:"refuse"`
	ECCCurve              Curve              `env:"ECC_CURVE" envDefault:"P256" to:"sds-server" bad:"warn"`
	FileMountedCerts      bool               `env:"FILE_MOUNTED_CERTS" to:"sds-server,xds-proxy" bad:"warn"`
	OutputCerts           string             `env:"OUTPUT_CERTS" to:"sds-server,agentd" bad:"warn"`

	// DNS (dns-proxy).
	DNSCapture         bool     `env:"ISTIO_META_DNS_CAPTURE" to:"dns-proxy,xds-proxy,envoy" bad:"warn"`
	DNSServer          bool     `env:"ISTIO_META_ENABLE_DNS_SERVER" to:"dns-proxy,xds-proxy" bad:"warn"`
	DNSProxyAddr       string   `env:"DNS_PROXY_ADDR" envDefault:"localhost:15053" to:"dns-proxy,envoy" bad:"warn"`
	DNSForwardParallel bool     `env:"DNS_FORWARD_PARALLEL" to:"dns-proxy" bad:"warn"`
	DNSForwardTimeout  Duration `env:"DNS_FORWARD_TIMEOUT" envDefault:"5s" to:"dns-proxy" bad:"warn"`

	// App probes (the prober). Istio refuses a malformed ISTIO_KUBE_APP_PROBERS.
	KubeAppProbers            string `env:"ISTIO_KUBE_APP_PROBERS" to:"prober" bad:"refuse"`
	LegacyLocalhostProbes     bool   `env:"REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION" to:"prober" bad:"warn"`
	HTTP2Probing              bool   `env:"ISTIO_ENABLE_HTTP2_PROBING" envDefault:"true" to:"prober" bad:"warn"`
	ProbeKeepaliveConnections bool   `env:"ENABLE_PROBE_KEEPALIVE_CONNECTIONS" to:"prober" bad:"warn"`
}

// Prefixes are the variables agentd reads by prefix: each one found is handed on, key by key.
var Prefixes = []Prefix{
	{Prefix: "ISTIO_META_", To: []string{"envoy", "agentd"}, Doc: "node metadata (Envoy's bootstrap and the gRPC bootstrap)"},
	{Prefix: "ISTIO_METAJSON_", To: []string{"envoy", "agentd"}, Doc: "node metadata given as JSON objects"},
	{Prefix: "XDS_HEADER_", To: []string{"xds-proxy"}, Doc: "gRPC headers on the upstream xDS stream"},
	{Prefix: "CA_HEADER_", To: []string{"sds-server"}, Doc: "gRPC headers on CSRs"},
}

// Prefix is a family of variables read by prefix.
type Prefix struct {
	Prefix string
	To     []string
	Doc    string
}

// Count is a non-negative integer.
type Count int

func (c *Count) UnmarshalText(b []byte) error {
	n, err := strconv.Atoi(string(b))
	if err != nil || n < 0 {
		return fmt.Errorf("%q: want a non-negative integer", b)
	}
	*c = Count(n)
	return nil
}

// Port is a TCP port number.
type Port int

func (p *Port) UnmarshalText(b []byte) error {
	n, err := strconv.Atoi(string(b))
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: want a port number", b)
	}
	*p = Port(n)
	return nil
}

// Ratio is a number in [0, 1].
type Ratio float64

func (r *Ratio) UnmarshalText(b []byte) error {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f < 0 || f > 1 {
		return fmt.Errorf("%q: want a number in [0, 1]", b)
	}
	*r = Ratio(f)
	return nil
}

// Duration is a non-negative duration (time.ParseDuration's form).
type Duration time.Duration

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil || v < 0 {
		return fmt.Errorf("%q: want a non-negative duration", b)
	}
	*d = Duration(v)
	return nil
}

// D is the duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// OptionalBool is a boolean that may be unset (Istio's "was set" variables).
type OptionalBool struct{ Set, Value bool }

func (o *OptionalBool) UnmarshalText(b []byte) error {
	v, err := strconv.ParseBool(string(b))
	if err != nil {
		return fmt.Errorf("%q: want true or false", b)
	}
	*o = OptionalBool{Set: true, Value: v}
	return nil
}

// SignatureAlgorithm is ECC_SIGNATURE_ALGORITHM: "" (RSA keys) or ECDSA.
type SignatureAlgorithm string

func (a *SignatureAlgorithm) UnmarshalText(b []byte) error {
	if v := string(b); v != "" && !strings.EqualFold(v, "ECDSA") {
		return fmt.Errorf("%q: want ECDSA (or unset, for RSA keys)", b)
	}
	*a = SignatureAlgorithm(strings.ToUpper(string(b)))
	return nil
}

// Curve is ECC_CURVE: P256 or P384.
type Curve string

func (c *Curve) UnmarshalText(b []byte) error {
	switch v := strings.ToUpper(string(b)); v {
	case "P256", "P384":
		*c = Curve(v)
		return nil
	}
	return fmt.Errorf("%q: want P256 or P384", b)
}
