package agent

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/agentd/agentd/internal/envoy/bootstrap"
	"github.com/agentd/agentd/internal/settings"
)

// views is what each process gets from a Settings: its configuration (or the error that
// stops the start), as text.
func views(t *testing.T, s *settings.Settings) map[string]string {
	t.Helper()
	show := func(m proto.Message, err error) string {
		if err != nil {
			return "error: " + err.Error()
		}
		if m == nil || !m.ProtoReflect().IsValid() {
			return "off"
		}
		return protojson.Format(m)
	}
	out := map[string]string{}
	out["xds-proxy"] = show(xdsProxyConfig(s))
	sds, sock, err := sdsConfig(s)
	out["sds-server"] = show(sds, err) + fmt.Sprint(sock)
	out["prober"] = show(proberConfig(s))
	if dns, socks, _, err := dnsProxyConfig(s, 0); s.DNSOn() {
		out["dns-proxy"] = show(dns, err) + fmt.Sprint(socks)
	}
	if !s.DisableEnvoy {
		cfg := bootstrapConfig(s)
		boot, err := bootstrap.Build(cfg)
		args, path, aerr := envoyCommand(s, cfg)
		p := envoyProcess(s, cfg, args, path)
		p.Prepare, p.Cleanup = nil, nil // closures: not comparable
		p.Env = nil                     // Envoy inherits every variable: not a sign that one reaches it
		out["envoy"] = fmt.Sprint(string(boot), err, args, aerr, p)
	}
	st, err := statusConfig(s)
	children := []string{"sds-server", "xds-proxy"}
	if !s.DisableEnvoy {
		children = append(children, "envoy")
	}
	grpc, gerr := grpcBootstrapOptions(s)
	gjs, _ := json.Marshal(grpc)
	out["agentd"] = fmt.Sprint(s.StatusPort, st.App, st.EnvoyMetricsURL, st.MetricsLocalhostOnly, st.DisableProfiling,
		children, grpcBootstrapPath(s), string(gjs), gerr, s.Env.ExitOnEnvoyExit)
	return out
}

// example is a value of a variable, and what else must be set for it to matter.
type example struct {
	set     string
	context []string
	live    bool   // a live SDS server on WORKLOAD_IDENTITY_SOCKET_FILE's socket
	file    string // written to set, where {root} is the root
}

// examples are the values TestEveryVariableReachesItsProcesses sets, by variable; a variable
// missing here gets "1", "true" or a path-like string, by its default.
var examples = map[string][]example{
	"PROXY_CONFIG":                               {{set: `{"discoveryAddress":"istiod.other:15012","statusPort":15030,"readinessProbe":{"tcpSocket":{"port":8080}}}`}},
	"ISTIO_CPU_LIMIT":                            {{set: "3"}},
	"DISABLE_ENVOY":                              {{set: "true"}},
	"ISTIO_DELTA_XDS":                            {{set: "false"}},
	"ENVOY_STATUS_PORT":                          {{set: "15031"}},
	"ENVOY_PROMETHEUS_PORT":                      {{set: "15091"}},
	"ENVOY_SKIP_DEPRECATED_LOGS":                 {{set: "false"}},
	"ISTIO_BOOTSTRAP_OVERRIDE":                   {{set: "{root}/override.yaml", file: "node: {cluster: other}"}},
	"HOST_IP":                                    {{set: "10.9.9.9", context: []string{`PROXY_CONFIG={"tracing":{"zipkin":{"address":"$(HOST_IP):9411"}}}`}}},
	"MINIMUM_DRAIN_DURATION":                     {{set: "7s", context: []string{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true"}}},
	"AGENTD_MAX_DRAIN_DURATION":                  {{set: "40s", context: []string{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true"}}},
	"WORKLOAD_IDENTITY_SOCKET_FILE":              {{set: "spire.sock", live: true}},
	"ISTIO_PROMETHEUS_ANNOTATIONS":               {{set: `{"scrape":"true","port":"9090","path":"/m"}`}},
	"PILOT_AGENT_MERGE_ENVOY_STATS":              {{set: "false"}},
	"PILOT_CERT_PROVIDER":                        {{set: "none"}, {set: "custom"}},
	"ISTIO_ENABLE_HTTP2_PROBING":                 {{set: "false", context: probers}},
	"GRPC_XDS_BOOTSTRAP":                         {{set: "etc/other/grpc.json"}},
	"ISTIOD_SAN":                                 {{set: "istiod.example"}},
	"ISTIO_META_TLS_CLIENT_CERT_CHAIN":           {{set: "/m/c.pem", context: []string{"FILE_MOUNTED_CERTS=true", "ISTIO_META_TLS_CLIENT_KEY=/m/k.pem"}}},
	"ISTIO_META_TLS_CLIENT_KEY":                  {{set: "/m/k.pem", context: []string{"FILE_MOUNTED_CERTS=true", "ISTIO_META_TLS_CLIENT_CERT_CHAIN=/m/c.pem"}}},
	"ISTIO_META_TLS_CLIENT_ROOT_CERT":            {{set: "/m/r.pem", context: []string{"FILE_MOUNTED_CERTS=true"}}},
	"FILE_MOUNTED_CERTS":                         {{set: "true", context: []string{"ISTIO_META_TLS_CLIENT_KEY=/m/k.pem", "ISTIO_META_TLS_CLIENT_CERT_CHAIN=/m/c.pem"}}},
	"SECRET_TTL":                                 {{set: "1h"}},
	"FILE_DEBOUNCE_DURATION":                     {{set: "1s"}},
	"SECRET_GRACE_PERIOD_RATIO":                  {{set: "0.3"}},
	"SECRET_GRACE_PERIOD_RATIO_JITTER":           {{set: "0.2"}},
	"WORKLOAD_RSA_KEY_SIZE":                      {{set: "4096"}},
	"ECC_SIGNATURE_ALGORITHM":                    {{set: "ECDSA"}},
	"ECC_CURVE":                                  {{set: "P384"}},
	"DNS_PROXY_ADDR":                             {{set: "127.0.0.1:25354", context: dnsOn}},
	"DNS_FORWARD_TIMEOUT":                        {{set: "2s", context: dnsOn}},
	"DNS_FORWARD_PARALLEL":                       {{set: "true", context: dnsOn}},
	"POD_NAMESPACE":                              {{set: "ns9", context: dnsOn}},
	"INSTANCE_IP":                                {{set: "10.1.2.3", context: probers}},
	"REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION": {{set: "true", context: probers}},
	"ENABLE_PROBE_KEEPALIVE_CONNECTIONS":         {{set: "true", context: probers}},
	"ISTIO_KUBE_APP_PROBERS":                     {{set: probers[0][len("ISTIO_KUBE_APP_PROBERS="):]}},
}

var (
	// pod is every example's start: a pod Envoy can have a node id for.
	pod     = []string{"POD_NAME=app-1", "POD_NAMESPACE=ns1"}
	dnsOn   = []string{"ISTIO_META_DNS_CAPTURE=true", "DNS_PROXY_ADDR=127.0.0.1:25353"} // a fixed port: nothing binds it
	probers = []string{`ISTIO_KUBE_APP_PROBERS={"/app-health/a/livez":{"httpGet":{"port":80}}}`}
)

// TestEveryVariableReachesItsProcesses: each row of the settings table changes the
// configuration of every process it names, from the variable to the child's config.
func TestEveryVariableReachesItsProcesses(t *testing.T) {
	for _, row := range settings.Rows() {
		t.Run(row.Name, func(t *testing.T) {
			exs := examples[row.Name]
			if exs == nil {
				exs = []example{{set: exampleOf(row)}}
			}
			changed := map[string]bool{}
			for _, ex := range exs {
				root, err := os.MkdirTemp("", "reach") // short: Unix socket paths
				if err != nil {
					t.Fatal(err)
				}
				defer os.RemoveAll(root)
				context := append(slices.Clone(pod), ex.context...)
				set := strings.ReplaceAll(ex.set, "{root}", root)
				if ex.file != "" {
					if err := os.WriteFile(set, []byte(ex.file), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				base := views(t, resolve(t, settings.Flags{Root: root}, context...))
				if again := views(t, resolve(t, settings.Flags{Root: root}, context...)); !maps.Equal(base, again) {
					t.Fatalf("the views of one configuration differ between two runs: the check could not fail")
				}
				if ex.live {
					path := filepath.Join(root, settings.SDSSocketDir, ex.set)
					os.MkdirAll(filepath.Dir(path), 0o755)
					l, err := net.Listen("unix", path)
					if err != nil {
						t.Fatal(err)
					}
					defer l.Close()
				}
				got := views(t, resolve(t, settings.Flags{Root: root}, append(context, row.Name+"="+set)...))
				for p := range got {
					if got[p] != base[p] {
						changed[p] = true
					}
				}
				for p := range base {
					if _, ok := got[p]; !ok {
						changed[p] = true
					}
				}
			}
			for _, p := range row.To {
				if !changed[p] {
					t.Errorf("%s (examples %+v) does not change %s's configuration", row.Name, exs, p)
				}
			}
		})
	}
}

// exampleOf is a valid value of row's type that is not its default.
func exampleOf(row settings.Row) string {
	switch row.Type {
	case reflect.TypeFor[bool](), reflect.TypeFor[settings.OptionalBool]():
		if row.Default == "true" {
			return "false"
		}
		return "true"
	case reflect.TypeFor[settings.Duration]():
		return "7m"
	case reflect.TypeFor[settings.Count]():
		return "7"
	case reflect.TypeFor[settings.Port]():
		return "15099"
	case reflect.TypeFor[settings.Ratio]():
		return "0.25"
	}
	return "/x/y.pem"
}
