package settings

// Ignored are the variables and flags of Istio's pilot-agent that agentd accepts and leaves
// alone, each with why. TestPilotAgentCoverage checks that every one pilot-agent reads is in
// the Env table, a prefix, a flag agentd parses, or here.
var Ignored = map[string]string{
	"CA_PROVIDER":                      "agentd speaks Istio's CA API (Citadel) only; another provider needs a certificate from files (FILE_MOUNTED_CERTS) or SPIRE's socket",
	"CLOUD_PLATFORM":                   "platform metadata (GCP, AWS) is not collected: the node has no PLATFORM_METADATA",
	"GCP_METADATA":                     "as CLOUD_PLATFORM",
	"GCP_QUOTA_PROJECT":                "as CLOUD_PLATFORM",
	"GCP_ZONE":                         "as CLOUD_PLATFORM",
	"COMPLIANCE_POLICY":                "FIPS-140 TLS settings: agentd's TLS is Go's defaults",
	"CREDENTIAL_FETCHER_TYPE":          "the token is the mounted istio-token (Istio's default, JWT); GCE credential fetching is not built",
	"CREDENTIAL_IDENTITY_PROVIDER":     "as CREDENTIAL_FETCHER_TYPE",
	"JWT_POLICY":                       "third-party-jwt (Istio's default) is the only token agentd reads",
	"XDS_AUTH_PROVIDER":                "only Istio's default: the istio-token as bearer",
	"ENVOY_SECURE_METRICS_PORT":        "secure metrics merging (Envoy's own TLS metrics port) is not built",
	"ENVOY_SECURE_MERGED_METRICS_PORT": "as ENVOY_SECURE_METRICS_PORT",
	"HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED": "read by Istio's bootstrap template through its runtime defaults only; Envoy's default applies",
	"ISTIO_META_ENABLE_SELF_DISCOVERY":                 "node metadata only (ISTIO_META_ prefix); the self-discovery listener is not built",

	"--tokenManagerPlugin":     "only Istio's default token manager (GoogleTokenExchange for --stsPort) is named in the node metadata; no STS server runs",
	"--log_caller":             "agentd's log lines have their own format (hclog); the level and JSON flags apply",
	"--log_stacktrace_level":   "as --log_caller",
	"--log_target":             "agentd logs to stderr, as the container runtime expects",
	"--log_rotate":             "as --log_target: rotation is the runtime's",
	"--log_rotate_max_age":     "as --log_rotate",
	"--log_rotate_max_size":    "as --log_rotate",
	"--log_rotate_max_backups": "as --log_rotate",
	"--vklog":                  "klog's verbosity: agentd has no klog",
}
