package bootstrap

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"istio.io/api/annotation"
	meshv1 "istio.io/api/mesh/v1alpha1"
)

// Stats Envoy must keep for readiness, draining and Istio's telemetry (pkg/bootstrap).
var (
	requiredStatsPrefixes = []string{"cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm"}
	requiredStatsSuffixes = []string{"rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied"}
	requiredStatsRegexps  = []string{`vhost\..*\.route\..*`}
)

// derived is every decision the bootstrap depends on, taken once from the Config as Istio's
// pkg/bootstrap takes it: the template's option set (params.go) and agentd's own bootstrap
// (bootstrap.go) are both written from it, so they cannot decide differently.
type derived struct {
	c        *Config
	node     *corev3.Node
	meta     map[string]any
	fam      ipFamily
	xdsType  string // GRPC or DELTA_GRPC
	metaDisc bool   // metadata discovery, on delta xDS only

	prefixes, suffixes, regexps []string // the stats inclusion list
	extraTags                   []string
	buckets                     []histogramBucket
	flush                       time.Duration // 0: not set
	eviction                    time.Duration // 0: not set

	runtime       map[string]any
	maxConns      int64
	compress      bool // the Prometheus listener compresses
	localhostOnly bool // METRICS_LOCALHOST_ACCESS_ONLY

	tracer     *tracer
	statsd     *hostPort
	metrics    *remoteService // envoyMetricsService
	accessLog  *remoteService // envoyAccessLogService
	loadStats  string         // LOAD_STATS_CONFIG_JSON metadata: a load_stats_config, raw JSON
	selfDisc   bool           // ENABLE_SELF_DISCOVERY metadata
	customFile bool           // the sds-files-grpc cluster
}

// histogramBucket is one entry of the histogram bucket settings.
type histogramBucket struct {
	Prefix  string
	Buckets []float64
}

// hostPort is an address of the ProxyConfig as Istio's addressConverter reads it: host and
// port split, $(HOST_IP) replaced by HOST_IP.
type hostPort struct{ host, port string }

type tracer struct {
	kind    string // zipkin, lightstep or datadog
	address hostPort
	tls     object // the transport socket of tlsSettings, or nil
}

// LightstepTokenFile is the file, in the ProxyConfig's configPath, that holds Lightstep's
// access token: Envoy's Lightstep tracer reads the token from a file, and pilot-agent writes
// it there with each bootstrap.
const LightstepTokenFile = "lightstep_access_token.txt"

// lightstepTokenPath is the token file as the bootstrap names it (relative to Envoy's
// working directory, as configPath is).
func lightstepTokenPath(pc *meshv1.ProxyConfig) string {
	return path.Join(pc.GetConfigPath(), LightstepTokenFile)
}

type remoteService struct {
	address   hostPort
	keepalive *meshv1.RemoteService
	tls       object // the transport socket of tlsSettings, or nil
}

func (c *Config) derive() (*derived, error) {
	pc := c.ProxyConfig
	node, err := c.Node()
	if err != nil {
		return nil, err
	}
	d := &derived{c: c, node: node, meta: node.GetMetadata().AsMap(), fam: familyOf(c.IPs, c.DualStack)}
	d.xdsType = "GRPC"
	if c.DeltaXDS {
		d.xdsType = "DELTA_GRPC"
	}
	d.metaDisc = d.meta["METADATA_DISCOVERY"] == "true"
	if d.metaDisc && !c.DeltaXDS {
		c.warn("disabling metadata discovery; not supported on SotW XDS (ISTIO_DELTA_XDS=false), as Istio does")
		d.metaDisc = false
	}
	if err := d.stats(); err != nil {
		return nil, err
	}
	d.runtime = runtimeFlags(pc)
	if d.maxConns, err = globalDownstreamMaxConnections(pc); err != nil {
		return nil, err
	}
	d.compress = statsCompression(pc)
	d.localhostOnly = pc.GetProxyMetadata()["METRICS_LOCALHOST_ACCESS_ONLY"] == "true"
	if err := d.remotes(); err != nil {
		return nil, err
	}
	d.loadStats = stringOf(d.meta["LOAD_STATS_CONFIG_JSON"])
	d.selfDisc = d.meta["ENABLE_SELF_DISCOVERY"] == "true"
	d.customFile = c.FileCredentials
	return d, nil
}

// address reads a host:port of the ProxyConfig as Istio's addressConverter does.
func (d *derived) address(what, hostPortStr string) (hostPort, error) {
	host, port, err := net.SplitHostPort(hostPortStr)
	if err != nil {
		return hostPort{}, fmt.Errorf("%s address %q: %w", what, hostPortStr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return hostPort{}, fmt.Errorf("%s address %q: bad port", what, hostPortStr)
	}
	if host == "$(HOST_IP)" {
		if ip := d.c.getenv("HOST_IP"); ip != "" {
			host = ip
		}
	}
	return hostPort{host: host, port: port}, nil
}

// remotes reads the tracer, statsd and the metrics and access log services.
func (d *derived) remotes() error {
	pc := d.c.ProxyConfig
	if t := pc.GetTracing(); t != nil {
		var kind, addr string
		switch tr := t.Tracer.(type) {
		case *meshv1.Tracing_Zipkin_:
			kind, addr = "zipkin", tr.Zipkin.GetAddress()
		case *meshv1.Tracing_Lightstep_:
			kind, addr = "lightstep", tr.Lightstep.GetAddress()
		case *meshv1.Tracing_Datadog_:
			kind, addr = "datadog", tr.Datadog.GetAddress()
		case nil:
		default:
			return fmt.Errorf("tracer %T is not supported by agentd's bootstrap (zipkin, lightstep or datadog)", t.Tracer)
		}
		if addr != "" {
			a, err := d.address(kind, addr)
			if err != nil {
				return fmt.Errorf("tracing: %w", err)
			}
			// Lightstep's collector speaks gRPC: its TLS keeps the ALPN, as Istio's does.
			d.tracer = &tracer{kind: kind, address: a, tls: d.tlsSocket(t.GetTlsSettings(), "tracer", kind == "lightstep")}
		}
	}
	if a := pc.GetStatsdUdpAddress(); a != "" {
		hp, err := d.address("statsdUdpAddress", a)
		if err != nil {
			return err
		}
		d.statsd = &hp
	}
	for _, rs := range []struct {
		name, sni string
		svc       *meshv1.RemoteService
		dst       **remoteService
	}{
		{"envoyMetricsService", "envoy_metrics_service", pc.GetEnvoyMetricsService(), &d.metrics},
		{"envoyAccessLogService", "envoy_accesslog_service", pc.GetEnvoyAccessLogService(), &d.accessLog},
	} {
		if rs.svc.GetAddress() == "" {
			continue
		}
		hp, err := d.address(rs.name, rs.svc.GetAddress())
		if err != nil {
			return err
		}
		*rs.dst = &remoteService{address: hp, keepalive: rs.svc, tls: d.tlsSocket(rs.svc.GetTlsSettings(), rs.sni, true)}
	}
	return nil
}

// ipFamily is how the proxy's addresses look: which localhost and wildcard Envoy binds.
type ipFamily struct {
	localhost, wildcard                     string
	additionalLocalhost, additionalWildcard string
	dnsLookup                               string // a cluster's dns_lookup_family
	dualStack                               bool
}

// familyOf is Istio's choice: IPv4 only, IPv6 only, or with ISTIO_DUAL_STACK both, the first
// address's family first.
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
		return ipFamily{localhost: "127.0.0.1", wildcard: "0.0.0.0", additionalLocalhost: "::1", additionalWildcard: "::", dnsLookup: "ALL", dualStack: true}
	}
	return ipFamily{localhost: "::1", wildcard: "::", additionalLocalhost: "127.0.0.1", additionalWildcard: "0.0.0.0", dnsLookup: "ALL", dualStack: true}
}

// runtimeFlags is the "global config" runtime layer: Istio's defaults with the ProxyConfig's
// runtimeValues over them ("" removes a default, "true"/"false" become booleans).
func runtimeFlags(pc *meshv1.ProxyConfig) map[string]any {
	flags := map[string]any{
		"re2.max_program_size.error_level": "32768",
		"envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst": true,
		"envoy.reloadable_features.http_reject_path_with_fragment":                                             false,
		"envoy.reloadable_features.fixed_heap_use_allocated":                                                   true,
		"envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update":                                       false,
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
	return flags
}

// globalDownstreamMaxConnections is the overload manager's limit, as Istio resolves it: the
// ProxyConfig's positive connection limit, else proxyMetadata
// ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS, else the runtime value
// overload.global_downstream_max_connections, else MaxInt32; values that are not integers are
// skipped. A limit that is not positive, which Envoy refuses, is an error.
func globalDownstreamMaxConnections(pc *meshv1.ProxyConfig) (int64, error) {
	if l := pc.GetConnectionSettings().GetGlobalDownstreamConnectionLimit(); l != nil && l.Value > 0 {
		return int64(l.Value), nil
	}
	for _, src := range []struct{ name, v string }{
		{"proxyMetadata ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS", pc.GetProxyMetadata()["ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"]},
		{"runtimeValues overload.global_downstream_max_connections", pc.GetRuntimeValues()["overload.global_downstream_max_connections"]},
	} {
		n, err := strconv.Atoi(src.v)
		if err != nil {
			continue
		}
		if n <= 0 {
			return 0, fmt.Errorf("%s %q: must be a positive integer", src.name, src.v)
		}
		return int64(n), nil
	}
	return math.MaxInt32, nil
}

// stats reads the stats options: the inclusion lists, extra tags, histogram buckets and the
// flush and eviction intervals (annotations over the ProxyConfig, as Istio's getStatsOptions).
func (d *derived) stats() error {
	c := d.c
	pc, annos := c.ProxyConfig, c.Annotations
	m := pc.GetProxyStatsMatcher()
	suffixes := requiredStatsSuffixes
	if c.ExitOnZeroActiveConnections {
		suffixes = append(slices.Clone(suffixes), "downstream_cx_active")
	}
	var errs []error
	list := func(annoName, field string, fromConfig, required []string) []string {
		l, err := inclusion(annos, annoName, field, fromConfig, required, c.IPs)
		errs = append(errs, err)
		return l
	}
	d.prefixes = list(annotation.SidecarStatsInclusionPrefixes.Name, "inclusionPrefixes", m.GetInclusionPrefixes(), requiredStatsPrefixes)
	d.suffixes = list(annotation.SidecarStatsInclusionSuffixes.Name, "inclusionSuffixes", m.GetInclusionSuffixes(), suffixes)
	d.regexps = list(annotation.SidecarStatsInclusionRegexps.Name, "inclusionRegexps", m.GetInclusionRegexps(), requiredStatsRegexps)
	d.extraTags = extraStatTags(pc, annos)
	for _, t := range d.extraTags {
		if len(t)+len(`(=\.=(.*?);\.;)`) > maxTagRegex {
			errs = append(errs, fmt.Errorf("extra stat tag %.40q...: longer than Envoy's tag expressions allow (%d bytes)", t, maxTagRegex))
		}
	}
	var err error
	d.buckets, err = histogramBuckets(annos[annotation.SidecarStatsHistogramBuckets.Name], c.warn)
	errs = append(errs, err)
	errs = append(errs, d.statsTiming())
	return errors.Join(errs...)
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

// extraStatTags are the ProxyConfig's then the annotation's tags, non-empty, once each.
func extraStatTags(pc *meshv1.ProxyConfig, annos map[string]string) []string {
	var tags []string
	for _, t := range append(slices.Clone(pc.GetExtraStatTags()), strings.Split(annos[annotation.SidecarExtraStatTags.Name], ",")...) {
		if t != "" {
			tags = append(tags, t)
		}
	}
	return dedup(tags)
}

// maxTagRegex is the longest tag regular expression Envoy accepts (TagSpecifier.regex).
const maxTagRegex = 1024

// histogramBuckets parses sidecar.istio.io/statsHistogramBuckets: {"prefix": [bounds...]},
// sorted by prefix. One that does not parse is warned about and ignored, as Istio does; an
// empty prefix or a bound Envoy refuses (not positive, repeated) is an error.
func histogramBuckets(anno string, warn func(string, ...any)) ([]histogramBucket, error) {
	if anno == "" {
		return nil, nil
	}
	name := annotation.SidecarStatsHistogramBuckets.Name
	var m map[string][]float64
	if err := json.Unmarshal([]byte(anno), &m); err != nil {
		warn("ignoring an annotation that does not parse, as Istio does", "annotation", name, "error", err)
		return nil, nil
	}
	var out []histogramBucket
	for _, p := range sortedKeys(m) {
		if p == "" {
			return nil, fmt.Errorf("annotation %s: empty prefix", name)
		}
		for i, v := range m[p] {
			if v <= 0 || slices.Contains(m[p][:i], v) {
				return nil, fmt.Errorf("annotation %s: %q: bound %v: must be positive and not repeated", name, p, v)
			}
		}
		out = append(out, histogramBucket{Prefix: p, Buckets: m[p]})
	}
	return out, nil
}

// Envoy's range for stats_flush_interval.
const minStatsFlush, maxStatsFlush = time.Millisecond, 5 * time.Minute

// statsTiming reads sidecar.istio.io/statsFlushInterval and statsEvictionInterval. Values
// that do not parse, or an eviction that is not a multiple of the flush interval, are warned
// about and ignored, as Istio does; a flush interval Envoy refuses is an error.
func (d *derived) statsTiming() error {
	annos, warn := d.c.Annotations, d.c.warn
	flush := 5 * time.Second // Envoy's default
	flushName, evictName := annotation.SidecarStatsFlushInterval.Name, annotation.SidecarStatsEvictionInterval.Name
	if v, ok := annos[flushName]; ok {
		f, err := time.ParseDuration(v)
		switch {
		case err != nil:
			warn("ignoring an annotation that does not parse, as Istio does", "annotation", flushName, "error", err)
		case f < minStatsFlush || f >= maxStatsFlush:
			return fmt.Errorf("annotation %s=%q: must be at least %v and less than %v", flushName, v, minStatsFlush, maxStatsFlush)
		default:
			flush, d.flush = f, f
		}
	}
	if v, ok := annos[evictName]; ok {
		e, err := time.ParseDuration(v)
		switch {
		case err != nil:
			warn("ignoring an annotation that does not parse, as Istio does", "annotation", evictName, "error", err)
		case e%flush != 0:
			warn("ignoring a stats eviction interval that is not a multiple of the flush interval, as Istio does", "annotation", evictName, "flush", flush)
		case e < time.Second:
			return fmt.Errorf("annotation %s=%q: must be at least 1s", evictName, v)
		default:
			d.eviction = e.Truncate(time.Second)
		}
	}
	return nil
}

// statsCompression says whether the Prometheus listener compresses: the ProxyConfig's
// statsCompression, on by default.
func statsCompression(pc *meshv1.ProxyConfig) bool {
	if sc := pc.GetStatsCompression(); sc != nil {
		return sc.Value
	}
	return true
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
