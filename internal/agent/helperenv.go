package agent

import (
	"slices"
	"strconv"
	"strings"
)

// Every Istio setting a helper uses is read here, in agentd, and handed to the helper in its
// typed configuration (see <helper>.go): no helper package reads an Istio variable itself
// (TestHelperEnvCoversGetenv checks the sources). A helper's environment is therefore only
// what its process and libraries read, so that a secret in agentd's environment (a token, a
// CA header) reaches no process that does not need it.
var (
	// helperEnvCommon is what every helper reads: its log level (component.Serve), the Go
	// runtime's settings, the time zone of its log lines and grpc-go's logging.
	helperEnvCommon = []string{
		"AGENTD_LOG_LEVEL",
		"GOGC", "GOMEMLIMIT", "GODEBUG", "GOMAXPROCS", "GOTRACEBACK",
		"TZ",
		"GRPC_GO_LOG_SEVERITY_LEVEL", "GRPC_GO_LOG_VERBOSITY_LEVEL", "GRPC_GO_LOG_FORMATTER",
	}
	// helperEnvUpstream is what a helper that dials the control plane or the CA reads as
	// grpc-go and crypto/x509 do: the HTTPS proxy (Istio's agent honours it too) and the
	// system roots (XDS_ROOT_CA=SYSTEM, CA_ROOT_CA=SYSTEM).
	helperEnvUpstream = []string{
		"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy",
		"SSL_CERT_FILE", "SSL_CERT_DIR",
	}
	// helperEnvAllowed is each helper's list beyond the common one. dns-proxy reads its
	// upstreams from the resolv.conf it is given; the prober only dials the pod's own
	// addresses, never through a proxy.
	helperEnvAllowed = map[string][]string{
		// xds-proxy also reads Docker's keychain for Wasm images without a pull secret, as
		// Istio's agent does.
		"xds-proxy":  append(slices.Clone(helperEnvUpstream), "DOCKER_CONFIG", "HOME"),
		"sds-server": helperEnvUpstream,
	}
)

// The Go runtime's settings for agentd and its helpers, unless agentd's environment sets them.
// The collector's percentage is memory.TreeGCPercent from each process's first collection on
// (agentd: tuneRuntime; a helper: component.Serve).
const (
	// treeGOMAXPROCS: one P per process. agentd and the helpers mostly wait on sockets, and each
	// P keeps partly used heap spans of its own: the idle tree is about 0.6 MB smaller per
	// process with one (scripts/bench/footprint.sh). dns-proxy picks its own, one more than
	// its UDP readers (cmd/dns-proxy), so it is not given one.
	treeGOMAXPROCS = 1
)

// helperEnv returns the variables of env that the helper name may see, in env's order, and
// the tree's GOMAXPROCS where env has none.
func helperEnv(name string, env []string) []string {
	allowed := helperEnvAllowed[name]
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return !slices.Contains(helperEnvCommon, k) && !slices.Contains(allowed, k)
	})
	if name != "dns-proxy" && !hasVar(out, "GOMAXPROCS") {
		out = append(out, "GOMAXPROCS="+strconv.Itoa(treeGOMAXPROCS))
	}
	return out
}

// hasVar reports whether env sets the variable name.
func hasVar(env []string, name string) bool {
	return slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, name+"=") })
}
