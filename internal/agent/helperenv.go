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
		"xds-proxy":  helperEnvUpstream,
		"sds-server": helperEnvUpstream,
	}
)

// treeGOGC is agentd's and its helpers' GOGC unless agentd's environment sets one: a
// collection when the heap grows by half rather than doubles. A process's heap here is mostly
// what it was handed at once (a name table, an xDS push, the bus's retained messages) and the
// garbage of decoding it; with 10 000 names and endpoints it keeps the tree's PSS about 15 MB
// lower in the helpers and 3-4 MB in agentd (scripts/bench/footprint.sh), for collections that
// are rare at steady state (dns-proxy's query path does not allocate).
const treeGOGC = 50

// helperEnv returns the variables of env that the helper name may see, in env's order, and
// GOGC=treeGOGC when env has no GOGC.
func helperEnv(name string, env []string) []string {
	allowed := helperEnvAllowed[name]
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return !slices.Contains(helperEnvCommon, k) && !slices.Contains(allowed, k)
	})
	if !hasGOGC(out) {
		out = append(out, "GOGC="+strconv.Itoa(treeGOGC))
	}
	return out
}

func hasGOGC(env []string) bool {
	return slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "GOGC=") })
}
