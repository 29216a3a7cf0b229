package bootstrap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"istio.io/api/annotation"
	meshv1 "istio.io/api/mesh/v1alpha1"
)

// File is where pilot-agent writes Envoy's bootstrap, relative to the root.
const File = "etc/istio/proxy/envoy-rev.json"

// Stats Envoy must keep for readiness, draining and Istio's telemetry (pkg/bootstrap).
var (
	requiredStatsPrefixes = []string{"cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm"}
	requiredStatsSuffixes = []string{"rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied"}
	requiredStatsRegexps  = []string{`vhost\..*\.route\..*`}
)

// Bootstrap generates Envoy's bootstrap from c, as Istio's template does, as indented JSON.
//
// The bootstrap is written as JSON directly, not through go-control-plane's Go types: those
// would link Envoy's whole config API into agentd's one executable, and every process of the
// tree would map it and register its descriptors at start. Input Envoy would reject is
// rejected here by explicit checks (Config.Check and the builders below); tests decode every
// configuration's output strictly and validate it with the types (package configcheck).
func Build(c *Config) ([]byte, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	doc, err := buildBootstrap(c)
	if err != nil {
		return nil, err
	}
	if err := checkUTF8(doc, "bootstrap"); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // regular expressions stay readable
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("encode bootstrap: %w", err)
	}
	return buf.Bytes(), nil
}

// Write generates the bootstrap and writes it to path (atomically, 0644).
func Write(c *Config, path string) error {
	data, err := Build(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write bootstrap: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write bootstrap: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write bootstrap: %w", err)
	}
	return nil
}

// object is one JSON object of the bootstrap in protojson's form, which Envoy reads: proto
// field names, enums by name, 64-bit integers as strings, durations as "1.500s", wrappers as
// bare values, an Any as its message's fields beside "@type".
type object = map[string]any

// typed is an Any holding a message of the named type (its full protobuf name).
func typed(typeName string, fields object) object {
	a := object{"@type": "type.googleapis.com/" + typeName}
	for k, v := range fields {
		a[k] = v
	}
	return a
}

// extension is Envoy's shape for a named, typed plug-in: filters, sinks, tracers, loggers,
// resource monitors, bootstrap extensions.
func extension(name, typeName string, fields object) object {
	return object{"name": name, "typed_config": typed(typeName, fields)}
}

// duration is d as protojson writes a google.protobuf.Duration: seconds with no, 3, 6 or 9
// decimals.
func duration(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	s := strconv.FormatInt(int64(d/time.Second), 10)
	if ns := d % time.Second; ns != 0 {
		frac := fmt.Sprintf("%09d", int64(ns))
		for strings.HasSuffix(frac, "000") {
			frac = frac[:len(frac)-3]
		}
		s += "." + frac
	}
	return sign + s + "s"
}

// checkUTF8 rejects a string that is not UTF-8, which protobuf forbids and encoding/json
// would silently replace.
func checkUTF8(v any, path string) error {
	switch x := v.(type) {
	case string:
		if !utf8.ValidString(x) {
			return fmt.Errorf("%s: %q is not valid UTF-8", path, x)
		}
	case object:
		for k, e := range x {
			if err := checkUTF8(k, path); err != nil {
				return err
			}
			if err := checkUTF8(e, path+"."+k); err != nil {
				return err
			}
		}
	case []object:
		for i, e := range x {
			if err := checkUTF8(e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case []string:
		for i, e := range x {
			if err := checkUTF8(e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// ipFamily is how the proxy's addresses look: which localhost and wildcard Envoy binds.
type ipFamily struct {
	localhost, wildcard, additionalWildcard string
	dnsLookup                               string // a cluster's dns_lookup_family
}

func familyOf(ips []string, dualStack bool) ipFamily {
	v4 := ipFamily{localhost: "127.0.0.1", wildcard: "0.0.0.0", dnsLookup: "V4_ONLY"}
	v6 := ipFamily{localhost: "::1", wildcard: "::", dnsLookup: "V6_ONLY"}
	n4, n6 := 0, 0
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil && a.Unmap().Is4() {
			n4++
		} else {
			n6++
		}
	}
	switch {
	case n6 == 0:
		return v4
	case n4 == 0:
		return v6
	case !dualStack:
		return v4
	}
	first, _ := netip.ParseAddr(ips[0])
	if first.Unmap().Is4() {
		v4.additionalWildcard, v4.dnsLookup = "::", "ALL"
		return v4
	}
	v6.additionalWildcard, v6.dnsLookup = "0.0.0.0", "ALL"
	return v6
}

func buildBootstrap(c *Config) (object, error) {
	pc := c.ProxyConfig
	node, err := c.Node()
	if err != nil {
		return nil, err
	}
	// The node stays a typed message (core/v3, which agentd links for xDS anyway).
	nodeJSON, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(node)
	if err != nil {
		return nil, fmt.Errorf("encode node: %w", err)
	}
	fam := familyOf(c.IPs, c.DualStack)
	stats, err := statsConfig(c)
	if err != nil {
		return nil, err
	}
	maxConns, err := globalDownstreamMaxConnections(pc)
	if err != nil {
		return nil, err
	}
	b := object{
		"node": json.RawMessage(nodeJSON),
		"layered_runtime": object{"layers": []object{
			{"name": "global config", "static_layer": runtimeFlags(pc)},
			{"name": "admin", "admin_layer": object{}},
		}},
		"bootstrap_extensions": bootstrapExtensions(c),
		"stats_config":         stats,
		"admin": object{
			"access_log": []object{extension("envoy.access_loggers.file",
				"envoy.extensions.access_loggers.file.v3.FileAccessLog", object{"path": "/dev/null"})},
			"profile_path": "/var/lib/istio/data/envoy.prof",
			"address":      socketAddress("TCP", fam.localhost, int(pc.ProxyAdminPort)),
		},
		"dynamic_resources": dynamicResources(c),
		"overload_manager": object{"resource_monitors": []object{extension(
			"envoy.resource_monitors.global_downstream_max_connections",
			"envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
			object{"max_active_downstream_connections": strconv.FormatInt(maxConns, 10)})}},
	}
	if err := statsTiming(b, c.Annotations); err != nil {
		return nil, err
	}
	sds := c.SDSSocket
	if sds == "" {
		sds = DefaultSDSSocket
	}
	clusters := []object{
		staticCluster("prometheus_stats", 250*time.Millisecond, socketAddress("TCP", fam.localhost, int(pc.ProxyAdminPort))),
		staticCluster("agent", 250*time.Millisecond, socketAddress("TCP", fam.localhost, int(pc.StatusPort))),
		grpcCluster(staticCluster("sds-grpc", time.Second, pipeAddress(sds))),
		xdsCluster(pc),
	}
	tracer, tracing, err := tracingConfig(pc, fam, node.Cluster)
	if err != nil {
		return nil, err
	}
	if tracer != nil {
		clusters = append(clusters, tracer)
		b["tracing"] = tracing
	}
	remote, sinks, err := remoteServices(pc, fam)
	if err != nil {
		return nil, err
	}
	clusters = append(clusters, remote...)
	if len(sinks) > 0 {
		b["stats_sinks"] = sinks
	}
	promAddr := fam.wildcard
	if pc.GetProxyMetadata()["METRICS_LOCALHOST_ACCESS_ONLY"] == "true" {
		promAddr = fam.localhost
	}
	b["static_resources"] = object{
		"clusters": clusters,
		"listeners": []object{
			httpListener(promAddr, fam.additionalWildcard, c.prometheusPort(), "stats", "/stats/prometheus", "prometheus_stats", statsCompression(pc, c.Annotations)),
			httpListener(fam.wildcard, fam.additionalWildcard, c.statusPort(), "agent", "/healthz/ready", "agent", false),
		},
	}
	if c.OutlierLogPath != "" {
		b["cluster_manager"] = object{"outlier_detection": object{"event_log_path": c.OutlierLogPath}}
	}
	return b, nil
}

// socketAddress is a core/v3 Address of protocol "TCP" or "UDP".
func socketAddress(protocol, host string, port int) object {
	return object{"socket_address": object{"protocol": protocol, "address": host, "port_value": port}}
}

func pipeAddress(path string) object {
	return object{"pipe": object{"path": path}}
}

func staticCluster(name string, timeout time.Duration, addr object) object {
	return object{
		"name":            name,
		"type":            "STATIC",
		"connect_timeout": duration(timeout),
		"lb_policy":       "ROUND_ROBIN",
		"load_assignment": loadAssignment(name, addr),
	}
}

func loadAssignment(name string, addr object) object {
	return object{
		"cluster_name": name,
		"endpoints":    []object{{"lb_endpoints": []object{{"endpoint": object{"address": addr}}}}},
	}
}

// grpcCluster makes c speak HTTP/2, as gRPC needs.
func grpcCluster(c object) object {
	const options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	c["typed_extension_protocol_options"] = object{
		options: typed(options, object{"explicit_http_config": object{"http2_protocol_options": object{}}}),
	}
	return c
}

// envoyGrpc is a core/v3 GrpcService through Envoy's own client to cluster.
func envoyGrpc(cluster string) object {
	return object{"envoy_grpc": object{"cluster_name": cluster}}
}

func xdsCluster(pc *meshv1.ProxyConfig) object {
	c := grpcCluster(staticCluster("xds-grpc", time.Second, pipeAddress(strings.TrimSuffix(pc.ConfigPath, "/")+"/XDS")))
	limits := func(priority string) object {
		return object{
			"priority":             priority,
			"max_connections":      100000,
			"max_pending_requests": 100000,
			"max_requests":         100000,
		}
	}
	c["circuit_breakers"] = object{"thresholds": []object{limits("DEFAULT"), limits("HIGH")}}
	c["upstream_connection_options"] = object{"tcp_keepalive": object{"keepalive_time": 300}}
	c["max_requests_per_connection"] = 1
	return c
}

func dynamicResources(c *Config) object {
	ads := func() object {
		return object{"ads": object{}, "initial_fetch_timeout": duration(0), "resource_api_version": "V3"}
	}
	api := "GRPC"
	if c.DeltaXDS {
		api = "DELTA_GRPC"
	}
	return object{
		"lds_config": ads(),
		"cds_config": ads(),
		"ads_config": object{
			"api_type":                       api,
			"set_node_on_first_message_only": true,
			"transport_api_version":          "V3",
			"grpc_services":                  []object{envoyGrpc("xds-grpc")},
		},
	}
}

func bootstrapExtensions(c *Config) []object {
	var ext []object
	if c.MetadataDiscovery {
		// Istio's proxy extension; its type is not part of Envoy's API, hence a TypedStruct.
		ext = append(ext, extension("metadata_discovery", "udpa.type.v1.TypedStruct", object{
			"type_url": "type.googleapis.com/istio.workload.BootstrapExtension",
			"value":    object{"config_source": object{"ads": object{}}},
		}))
	}
	return append(ext, extension("envoy.bootstrap.internal_listener",
		"envoy.extensions.bootstrap.internal_listener.v3.InternalListener", object{"buffer_size_kb": 64}))
}

// runtimeFlags is the "global config" runtime layer: Istio's defaults with the ProxyConfig's
// runtimeValues over them ("" removes a default, "true"/"false" become booleans).
func runtimeFlags(pc *meshv1.ProxyConfig) map[string]any {
	flags := map[string]any{
		"re2.max_program_size.error_level": "32768",
		"envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst": true,
		"envoy.reloadable_features.http_reject_path_with_fragment":                                             false,
	}
	for k, v := range pc.GetRuntimeValues() {
		switch v {
		case "":
			delete(flags, k)
		case "true":
			flags[k] = true
		case "false":
			flags[k] = false
		default:
			flags[k] = v
		}
	}
	delete(flags, "overload.global_downstream_max_connections") // the overload manager holds it
	return flags
}

// globalDownstreamMaxConnections is the overload manager's limit: the ProxyConfig's
// connection limit, else proxyMetadata ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS, else the
// runtime value overload.global_downstream_max_connections, else MaxInt32.
func globalDownstreamMaxConnections(pc *meshv1.ProxyConfig) (int64, error) {
	if l := pc.GetConnectionSettings().GetGlobalDownstreamConnectionLimit(); l != nil {
		if l.Value <= 0 {
			return 0, fmt.Errorf("connectionSettings.globalDownstreamConnectionLimit %d: must be positive", l.Value)
		}
		return int64(l.Value), nil
	}
	for _, src := range []struct{ name, v string }{
		{"proxyMetadata ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS", pc.GetProxyMetadata()["ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"]},
		{"runtimeValues overload.global_downstream_max_connections", pc.GetRuntimeValues()["overload.global_downstream_max_connections"]},
	} {
		if src.v == "" {
			continue
		}
		n, err := strconv.ParseInt(src.v, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%s %q: must be a positive integer", src.name, src.v)
		}
		return n, nil
	}
	return math.MaxInt32, nil
}

// statsConfig is Istio's tag extraction and inclusion list.
func statsConfig(c *Config) (object, error) {
	pc, annos := c.ProxyConfig, c.Annotations
	tags, err := statsTags(extraStatTags(pc, annos))
	if err != nil {
		return nil, err
	}
	m := pc.GetProxyStatsMatcher()
	suffixes := requiredStatsSuffixes
	if c.ExitOnZeroActiveConnections {
		suffixes = append(append([]string{}, suffixes...), "downstream_cx_active")
	}
	var errs []error
	list := func(annoName, field string, fromConfig, required []string) []string {
		l, err := inclusion(annos, annoName, field, fromConfig, required, c.IPs)
		errs = append(errs, err)
		return l
	}
	prefixes := list(annotation.SidecarStatsInclusionPrefixes.Name, "inclusionPrefixes", m.GetInclusionPrefixes(), requiredStatsPrefixes)
	suffixList := list(annotation.SidecarStatsInclusionSuffixes.Name, "inclusionSuffixes", m.GetInclusionSuffixes(), suffixes)
	regexps := list(annotation.SidecarStatsInclusionRegexps.Name, "inclusionRegexps", m.GetInclusionRegexps(), requiredStatsRegexps)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	var patterns []object
	add := func(f func(string) object, l ...string) {
		for _, s := range l {
			patterns = append(patterns, f(s))
		}
	}
	add(prefixMatcher, "reporter=")
	if c.MetadataDiscovery {
		add(prefixMatcher, "workload_discovery")
	}
	add(prefixMatcher, prefixes...)
	add(func(s string) object { return object{"suffix": s} }, suffixList...)
	add(func(s string) object { return object{"safe_regex": object{"regex": s}} }, regexps...)
	add(prefixMatcher, "component", "istio")

	sc := object{
		"stats_tags":           tags,
		"use_all_default_tags": false,
		"stats_matcher":        object{"inclusion_list": object{"patterns": patterns}},
	}
	buckets, err := histogramBuckets(annos[annotation.SidecarStatsHistogramBuckets.Name])
	if err != nil {
		return nil, err
	}
	if len(buckets) > 0 {
		sc["histogram_bucket_settings"] = buckets
	}
	return sc, nil
}

// prefixMatcher is a type/matcher/v3 StringMatcher on a prefix.
func prefixMatcher(prefix string) object {
	return object{"prefix": prefix}
}

// inclusion is the annotation's comma list, else the ProxyConfig's proxyStatsMatcher field,
// plus the required ones, with {pod_ip} replaced by each of the proxy's IPs. An empty entry,
// which Envoy rejects, is an error.
func inclusion(annos map[string]string, annoName, field string, fromConfig, required []string, ips []string) ([]string, error) {
	var l []string
	if anno := annos[annoName]; anno != "" {
		l = strings.Split(anno, ",")
		if slices.Contains(l, "") {
			return nil, fmt.Errorf("annotation %s=%q: empty entry", annoName, anno)
		}
	} else {
		if slices.Contains(fromConfig, "") {
			return nil, fmt.Errorf("proxyStatsMatcher.%s: empty entry", field)
		}
		l = append(l, fromConfig...)
	}
	l = append(l, required...)
	var out []string
	for _, p := range l {
		if !strings.Contains(p, "{pod_ip}") {
			out = append(out, p)
			continue
		}
		for _, ip := range ips {
			out = append(out, strings.ReplaceAll(p, "{pod_ip}", ip))
		}
	}
	return out, nil
}

func extraStatTags(pc *meshv1.ProxyConfig, annos map[string]string) []string {
	var tags []string
	for _, t := range append(append([]string{}, pc.GetExtraStatTags()...), strings.Split(annos[annotation.SidecarExtraStatTags.Name], ",")...) {
		if t = strings.TrimSpace(t); t != "" {
			tags = append(tags, t)
		}
	}
	return dedup(tags)
}

// maxTagRegex is the longest tag regular expression Envoy accepts (TagSpecifier.regex).
const maxTagRegex = 1024

func statsTags(extra []string) ([]object, error) {
	tag := func(name, re string) object {
		return object{"tag_name": name, "regex": re}
	}
	tags := []object{
		tag("cluster_name", `^cluster\.((.+?(\..+?\.svc\.cluster\.local)?)\.)`),
		tag("tcp_prefix", `^tcp\.((.*?)\.)\w+?$`),
		tag("response_code", `_rq(_(\d{3}))$`),
		tag("response_code_class", `_rq(_(\dxx))$`),
		tag("http_conn_manager_listener_prefix", `^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`),
		tag("http_conn_manager_prefix", `^http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`),
		tag("listener_address", `^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`),
		tag("mongo_prefix", `^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$`),
	}
	for _, t := range extra {
		re := `(` + t + `=\.=(.*?);\.;)`
		if len(re) > maxTagRegex {
			return nil, fmt.Errorf("extra stat tag %.40q...: longer than Envoy's tag expressions allow (%d bytes)", t, maxTagRegex)
		}
		tags = append(tags, tag(t, re))
	}
	return append(tags,
		tag("cache", `(cache\.(.+?)\.)`),
		tag("component", `(component\.(.+?)\.)`),
		tag("tag", `(tag\.(.+?);\.)`),
		tag("wasm_filter", `(wasm_filter\.(.+?)\.)`),
		tag("authz_enforce_result", `rbac(\.(allowed|denied))`),
		tag("authz_dry_run_action", `(\.istio_dry_run_(allow|deny)_)`),
		tag("authz_dry_run_result", `(\.shadow_(allowed|denied))`),
	), nil
}

// histogramBuckets parses sidecar.istio.io/statsHistogramBuckets: {"prefix": [bounds...]},
// each prefix non-empty and each bound positive and given once, as Envoy requires.
func histogramBuckets(anno string) ([]object, error) {
	if anno == "" {
		return nil, nil
	}
	name := annotation.SidecarStatsHistogramBuckets.Name
	var m map[string][]float64
	if err := json.Unmarshal([]byte(anno), &m); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", name, err)
	}
	var out []object
	for _, p := range sortedKeys(m) {
		if p == "" {
			return nil, fmt.Errorf("annotation %s: empty prefix", name)
		}
		for i, v := range m[p] {
			if v <= 0 || slices.Contains(m[p][:i], v) {
				return nil, fmt.Errorf("annotation %s: %q: bound %v: must be positive and not repeated", name, p, v)
			}
		}
		out = append(out, object{"match": prefixMatcher(p), "buckets": m[p]})
	}
	return out, nil
}

// Envoy's range for stats_flush_interval.
const minStatsFlush, maxStatsFlush = time.Millisecond, 5 * time.Minute

// statsTiming applies sidecar.istio.io/statsFlushInterval and statsEvictionInterval.
func statsTiming(b object, annos map[string]string) error {
	flush := 5 * time.Second // Envoy's default
	if v, ok := annos[annotation.SidecarStatsFlushInterval.Name]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("annotation %s=%q: %w", annotation.SidecarStatsFlushInterval.Name, v, err)
		}
		if d < minStatsFlush || d >= maxStatsFlush {
			return fmt.Errorf("annotation %s=%q: must be at least %v and less than %v", annotation.SidecarStatsFlushInterval.Name, v, minStatsFlush, maxStatsFlush)
		}
		flush = d
		b["stats_flush_interval"] = duration(d)
	}
	if v, ok := annos[annotation.SidecarStatsEvictionInterval.Name]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("annotation %s=%q: %w", annotation.SidecarStatsEvictionInterval.Name, v, err)
		}
		if d <= 0 || d%flush != 0 {
			return fmt.Errorf("annotation %s=%q: must be a positive multiple of the stats flush interval %v", annotation.SidecarStatsEvictionInterval.Name, v, flush)
		}
		b["stats_eviction_interval"] = duration(d)
	}
	return nil
}

// statsCompression says whether the Prometheus listener compresses: on unless the ProxyConfig
// or the sidecar.istio.io/statsCompression annotation turns it off.
func statsCompression(pc *meshv1.ProxyConfig, annos map[string]string) bool {
	if v, ok := annos[annotation.SidecarStatsCompression.Name]; ok {
		on, err := strconv.ParseBool(v)
		return err != nil || on
	}
	if sc := pc.GetStatsCompression(); sc != nil {
		return sc.Value
	}
	return true
}

// httpListener is a static listener on port that routes one path prefix to one cluster.
func httpListener(addr, additional string, port int, statPrefix, pathPrefix, cluster string, compress bool) object {
	var filters []object
	if compress {
		for _, lib := range []struct{ name, typeName string }{
			{"brotli", "envoy.extensions.compression.brotli.compressor.v3.Brotli"},
			{"gzip", "envoy.extensions.compression.gzip.compressor.v3.Gzip"},
			{"zstd", "envoy.extensions.compression.zstd.compressor.v3.Zstd"},
		} {
			filters = append(filters, extension("envoy.filters.http.compressor", "envoy.extensions.filters.http.compressor.v3.Compressor", object{
				"compressor_library": extension(lib.name, lib.typeName, nil),
				"choose_first":       true,
			}))
		}
	}
	filters = append(filters, extension("envoy.filters.http.router", "envoy.extensions.filters.http.router.v3.Router", nil))
	hcm := object{
		"codec_type":  "AUTO",
		"stat_prefix": statPrefix,
		"route_config": object{"virtual_hosts": []object{{
			"name":    "backend",
			"domains": []string{"*"},
			"routes": []object{{
				"match": object{"prefix": pathPrefix},
				"route": object{"cluster": cluster},
			}},
		}}},
		"http_filters": filters,
	}
	l := object{
		"address": socketAddress("TCP", addr, port),
		"filter_chains": []object{{"filters": []object{extension("envoy.filters.network.http_connection_manager",
			"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager", hcm)}}},
	}
	if additional != "" {
		l["additional_addresses"] = []object{{"address": socketAddress("TCP", additional, port)}}
	}
	return l
}

// dnsCluster is a STRICT_DNS cluster for a host:port outside the proxy.
func dnsCluster(name, hostPort string, fam ipFamily) (object, error) {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return nil, fmt.Errorf("%s address %q: %w", name, hostPort, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%s address %q: bad port", name, hostPort)
	}
	return object{
		"name":              name,
		"type":              "STRICT_DNS",
		"respect_dns_ttl":   true,
		"dns_lookup_family": fam.dnsLookup,
		"connect_timeout":   duration(time.Second),
		"lb_policy":         "ROUND_ROBIN",
		"load_assignment":   loadAssignment(name, socketAddress("TCP", host, int(p))),
	}, nil
}

// tracingConfig returns the tracer's cluster and Envoy's tracing, when one is configured.
func tracingConfig(pc *meshv1.ProxyConfig, fam ipFamily, serviceName string) (cluster, tracing object, err error) {
	t := pc.GetTracing()
	if t == nil || t.Tracer == nil {
		return nil, nil, nil
	}
	if t.GetTlsSettings() != nil {
		return nil, nil, errors.New("tracing.tlsSettings is not supported by agentd's bootstrap")
	}
	var name, typeName, clusterName, addr string
	var cfg object
	switch tr := t.Tracer.(type) {
	case *meshv1.Tracing_Zipkin_:
		name, typeName, clusterName, addr = "envoy.tracers.zipkin", "envoy.config.trace.v3.ZipkinConfig", "zipkin", tr.Zipkin.GetAddress()
		cfg = object{
			"collector_cluster":          clusterName,
			"collector_endpoint":         "/api/v2/spans",
			"collector_endpoint_version": "HTTP_JSON",
			"trace_id_128bit":            true,
			"shared_span_context":        false,
		}
	case *meshv1.Tracing_Datadog_:
		name, typeName, clusterName, addr = "envoy.tracers.datadog", "envoy.config.trace.v3.DatadogConfig", "datadog_agent", tr.Datadog.GetAddress()
		cfg = object{"collector_cluster": clusterName, "service_name": serviceName}
	default:
		return nil, nil, fmt.Errorf("tracer %T is not supported by agentd's bootstrap (zipkin or datadog)", t.Tracer)
	}
	if addr == "" {
		return nil, nil, nil
	}
	cluster, err = dnsCluster(clusterName, addr, fam)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %w", err)
	}
	if clusterName == "zipkin" {
		cluster["dns_refresh_rate"] = duration(30 * time.Second)
	}
	return cluster, object{"http": extension(name, typeName, cfg)}, nil
}

// remoteServices returns the clusters of the metrics and access log services, and the stats
// sinks: the metrics service and statsd.
func remoteServices(pc *meshv1.ProxyConfig, fam ipFamily) (clusters, sinks []object, err error) {
	for _, rs := range []struct {
		name string
		svc  *meshv1.RemoteService
	}{{"envoy_metrics_service", pc.GetEnvoyMetricsService()}, {"envoy_accesslog_service", pc.GetEnvoyAccessLogService()}} {
		if rs.svc.GetAddress() == "" {
			continue
		}
		if rs.svc.GetTlsSettings() != nil {
			return nil, nil, fmt.Errorf("%s tlsSettings is not supported by agentd's bootstrap", rs.name)
		}
		c, err := dnsCluster(rs.name, rs.svc.GetAddress(), fam)
		if err != nil {
			return nil, nil, err
		}
		if ka := rs.svc.GetTcpKeepalive(); ka != nil {
			tk := object{}
			if ka.Probes > 0 {
				tk["keepalive_probes"] = ka.Probes
			}
			if ka.Time != nil {
				tk["keepalive_time"] = uint32(ka.Time.AsDuration().Seconds())
			}
			if ka.Interval != nil {
				tk["keepalive_interval"] = uint32(ka.Interval.AsDuration().Seconds())
			}
			c["upstream_connection_options"] = object{"tcp_keepalive": tk}
		}
		clusters = append(clusters, grpcCluster(c))
	}
	if pc.GetEnvoyMetricsService().GetAddress() != "" {
		sinks = append(sinks, extension("envoy.stat_sinks.metrics_service", "envoy.config.metrics.v3.MetricsServiceConfig", object{
			"transport_api_version": "V3",
			"grpc_service":          envoyGrpc("envoy_metrics_service"),
		}))
	}
	if a := pc.GetStatsdUdpAddress(); a != "" {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, nil, fmt.Errorf("statsdUdpAddress %q: %w", a, err)
		}
		p, _ := strconv.ParseUint(port, 10, 16)
		if net.ParseIP(host) == nil { // Envoy needs an IP; Istio resolves the name at start
			ips, err := net.LookupIP(host)
			if err != nil || len(ips) == 0 {
				return nil, nil, fmt.Errorf("statsdUdpAddress %q: resolve %s: %v", a, host, err)
			}
			host = ips[0].String()
		}
		sinks = append(sinks, extension("envoy.stat_sinks.statsd", "envoy.config.metrics.v3.StatsdSink", object{
			"address": socketAddress("UDP", host, int(p)),
		}))
	}
	return clusters, sinks, nil
}
