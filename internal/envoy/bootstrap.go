package envoy

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
	"strconv"
	"strings"
	"time"

	udpav1 "github.com/cncf/xds/go/udpa/type/v1"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	overloadv3 "github.com/envoyproxy/go-control-plane/envoy/config/overload/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tracev3 "github.com/envoyproxy/go-control-plane/envoy/config/trace/v3"
	filev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	internallistenerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/bootstrap/internal_listener/v3"
	brotliv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/brotli/compressor/v3"
	gzipv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/gzip/compressor/v3"
	zstdv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/zstd/compressor/v3"
	compressorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/compressor/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	downstreamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"istio.io/api/annotation"
	meshv1 "istio.io/api/mesh/v1alpha1"
)

// BootstrapFile is where pilot-agent writes Envoy's bootstrap, relative to the root.
const BootstrapFile = "etc/istio/proxy/envoy-rev.json"

// Stats Envoy must keep for readiness, draining and Istio's telemetry (pkg/bootstrap).
var (
	requiredStatsPrefixes = []string{"cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm"}
	requiredStatsSuffixes = []string{"rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied"}
	requiredStatsRegexps  = []string{`vhost\..*\.route\..*`}
)

// Bootstrap generates Envoy's bootstrap from c, as Istio's template does, and validates it.
func Bootstrap(c *Config) (*bootstrapv3.Bootstrap, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	b, err := buildBootstrap(c)
	if err != nil {
		return nil, err
	}
	if err := Validate(b); err != nil {
		return nil, fmt.Errorf("generated bootstrap is invalid: %w", err)
	}
	return b, nil
}

// MarshalBootstrap encodes b as indented JSON with a stable layout.
func MarshalBootstrap(b *bootstrapv3.Bootstrap) ([]byte, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("encode bootstrap: %w", err)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return nil, fmt.Errorf("indent bootstrap: %w", err)
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

// WriteBootstrap generates, validates and writes the bootstrap to path (atomically, 0644).
func WriteBootstrap(c *Config, path string) error {
	b, err := Bootstrap(c)
	if err != nil {
		return err
	}
	data, err := MarshalBootstrap(b)
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

// ipFamily is how the proxy's addresses look: which localhost and wildcard Envoy binds.
type ipFamily struct {
	localhost, wildcard, additionalWildcard string
	dnsLookup                               clusterv3.Cluster_DnsLookupFamily
}

func familyOf(ips []string, dualStack bool) ipFamily {
	v4 := ipFamily{localhost: "127.0.0.1", wildcard: "0.0.0.0", dnsLookup: clusterv3.Cluster_V4_ONLY}
	v6 := ipFamily{localhost: "::1", wildcard: "::", dnsLookup: clusterv3.Cluster_V6_ONLY}
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
		v4.additionalWildcard, v4.dnsLookup = "::", clusterv3.Cluster_ALL
		return v4
	}
	v6.additionalWildcard, v6.dnsLookup = "0.0.0.0", clusterv3.Cluster_ALL
	return v6
}

func buildBootstrap(c *Config) (*bootstrapv3.Bootstrap, error) {
	pc := c.ProxyConfig
	node, err := c.Node()
	if err != nil {
		return nil, err
	}
	fam := familyOf(c.IPs, c.DualStack)
	stats, err := statsConfig(c)
	if err != nil {
		return nil, err
	}
	runtime, err := structpb.NewStruct(runtimeFlags(pc))
	if err != nil {
		return nil, fmt.Errorf("runtime values: %w", err)
	}
	maxConns, err := globalDownstreamMaxConnections(pc)
	if err != nil {
		return nil, err
	}
	b := &bootstrapv3.Bootstrap{
		Node: node,
		LayeredRuntime: &bootstrapv3.LayeredRuntime{Layers: []*bootstrapv3.RuntimeLayer{
			{Name: "global config", LayerSpecifier: &bootstrapv3.RuntimeLayer_StaticLayer{StaticLayer: runtime}},
			{Name: "admin", LayerSpecifier: &bootstrapv3.RuntimeLayer_AdminLayer_{AdminLayer: &bootstrapv3.RuntimeLayer_AdminLayer{}}},
		}},
		BootstrapExtensions: bootstrapExtensions(c),
		StatsConfig:         stats,
		Admin: &bootstrapv3.Admin{
			AccessLog: []*accesslogv3.AccessLog{{
				Name:       "envoy.access_loggers.file",
				ConfigType: &accesslogv3.AccessLog_TypedConfig{TypedConfig: mustAny(&filev3.FileAccessLog{Path: "/dev/null"})},
			}},
			ProfilePath: "/var/lib/istio/data/envoy.prof",
			Address:     socketAddress(fam.localhost, int(pc.ProxyAdminPort)),
		},
		DynamicResources: dynamicResources(c),
		StaticResources:  &bootstrapv3.Bootstrap_StaticResources{},
		OverloadManager: &overloadv3.OverloadManager{
			ResourceMonitors: []*overloadv3.ResourceMonitor{{
				Name: "envoy.resource_monitors.global_downstream_max_connections",
				ConfigType: &overloadv3.ResourceMonitor_TypedConfig{TypedConfig: mustAny(
					&downstreamv3.DownstreamConnectionsConfig{MaxActiveDownstreamConnections: maxConns})},
			}},
		},
	}
	if err := statsTiming(b, c.Annotations); err != nil {
		return nil, err
	}
	sds := c.SDSSocket
	if sds == "" {
		sds = DefaultSDSSocket
	}
	sr := b.StaticResources
	sr.Clusters = []*clusterv3.Cluster{
		staticCluster("prometheus_stats", 250*time.Millisecond, socketAddress(fam.localhost, int(pc.ProxyAdminPort))),
		staticCluster("agent", 250*time.Millisecond, socketAddress(fam.localhost, int(pc.StatusPort))),
		grpcCluster(staticCluster("sds-grpc", time.Second, pipeAddress(sds))),
		xdsCluster(pc),
	}
	extra, tracing, err := tracingConfig(pc, fam, node.Cluster)
	if err != nil {
		return nil, err
	}
	sr.Clusters = append(sr.Clusters, extra...)
	b.Tracing = tracing
	if err := remoteServices(b, pc, fam); err != nil {
		return nil, err
	}
	promAddr := fam.wildcard
	if pc.GetProxyMetadata()["METRICS_LOCALHOST_ACCESS_ONLY"] == "true" {
		promAddr = fam.localhost
	}
	sr.Listeners = []*listenerv3.Listener{
		httpListener(promAddr, fam.additionalWildcard, c.prometheusPort(), "stats", "/stats/prometheus", "prometheus_stats", statsCompression(pc, c.Annotations)),
		httpListener(fam.wildcard, fam.additionalWildcard, c.statusPort(), "agent", "/healthz/ready", "agent", false),
	}
	if c.OutlierLogPath != "" {
		b.ClusterManager = &bootstrapv3.ClusterManager{OutlierDetection: &bootstrapv3.ClusterManager_OutlierDetection{EventLogPath: c.OutlierLogPath}}
	}
	return b, nil
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err) // only on a message that cannot be marshalled, which these are not
	}
	return a
}

func socketAddress(host string, port int) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Protocol:      corev3.SocketAddress_TCP,
		Address:       host,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
	}}}
}

func pipeAddress(path string) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}}
}

func staticCluster(name string, timeout time.Duration, addr *corev3.Address) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(timeout),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		LoadAssignment:       loadAssignment(name, addr),
	}
}

func loadAssignment(name string, addr *corev3.Address) *endpointv3.ClusterLoadAssignment {
	return &endpointv3.ClusterLoadAssignment{
		ClusterName: name,
		Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}},
		}}}},
	}
}

// grpcCluster makes c speak HTTP/2, as gRPC needs.
func grpcCluster(c *clusterv3.Cluster) *clusterv3.Cluster {
	c.TypedExtensionProtocolOptions = map[string]*anypb.Any{
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
			}},
		}),
	}
	return c
}

func xdsCluster(pc *meshv1.ProxyConfig) *clusterv3.Cluster {
	c := grpcCluster(staticCluster("xds-grpc", time.Second, pipeAddress(strings.TrimSuffix(pc.ConfigPath, "/")+"/XDS")))
	limits := func(p corev3.RoutingPriority) *clusterv3.CircuitBreakers_Thresholds {
		return &clusterv3.CircuitBreakers_Thresholds{
			Priority:           p,
			MaxConnections:     wrapperspb.UInt32(100000),
			MaxPendingRequests: wrapperspb.UInt32(100000),
			MaxRequests:        wrapperspb.UInt32(100000),
		}
	}
	c.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{
		limits(corev3.RoutingPriority_DEFAULT), limits(corev3.RoutingPriority_HIGH),
	}}
	c.UpstreamConnectionOptions = &clusterv3.UpstreamConnectionOptions{TcpKeepalive: &corev3.TcpKeepalive{KeepaliveTime: wrapperspb.UInt32(300)}}
	c.MaxRequestsPerConnection = wrapperspb.UInt32(1)
	return c
}

func dynamicResources(c *Config) *bootstrapv3.Bootstrap_DynamicResources {
	ads := func() *corev3.ConfigSource {
		return &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			InitialFetchTimeout:   durationpb.New(0),
			ResourceApiVersion:    corev3.ApiVersion_V3,
		}
	}
	api := corev3.ApiConfigSource_GRPC
	if c.DeltaXDS {
		api = corev3.ApiConfigSource_DELTA_GRPC
	}
	return &bootstrapv3.Bootstrap_DynamicResources{
		LdsConfig: ads(),
		CdsConfig: ads(),
		AdsConfig: &corev3.ApiConfigSource{
			ApiType:                   api,
			SetNodeOnFirstMessageOnly: true,
			TransportApiVersion:       corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "xds-grpc"},
			}}},
		},
	}
}

func bootstrapExtensions(c *Config) []*corev3.TypedExtensionConfig {
	var ext []*corev3.TypedExtensionConfig
	if c.MetadataDiscovery {
		// Istio's proxy extension; its type is not part of Envoy's API, hence a TypedStruct.
		value, _ := structpb.NewStruct(map[string]any{"config_source": map[string]any{"ads": map[string]any{}}})
		ext = append(ext, &corev3.TypedExtensionConfig{
			Name:        "metadata_discovery",
			TypedConfig: mustAny(&udpav1.TypedStruct{TypeUrl: "type.googleapis.com/istio.workload.BootstrapExtension", Value: value}),
		})
	}
	return append(ext, &corev3.TypedExtensionConfig{
		Name:        "envoy.bootstrap.internal_listener",
		TypedConfig: mustAny(&internallistenerv3.InternalListener{BufferSizeKb: wrapperspb.UInt32(64)}),
	})
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
func statsConfig(c *Config) (*metricsv3.StatsConfig, error) {
	pc, annos := c.ProxyConfig, c.Annotations
	tags := statsTags(extraStatTags(pc, annos))
	m := pc.GetProxyStatsMatcher()
	suffixes := requiredStatsSuffixes
	if c.ExitOnZeroActiveConnections {
		suffixes = append(append([]string{}, suffixes...), "downstream_cx_active")
	}
	prefixes := inclusion(annos[annotation.SidecarStatsInclusionPrefixes.Name], m.GetInclusionPrefixes(), requiredStatsPrefixes, c.IPs)
	suffixList := inclusion(annos[annotation.SidecarStatsInclusionSuffixes.Name], m.GetInclusionSuffixes(), suffixes, c.IPs)
	regexps := inclusion(annos[annotation.SidecarStatsInclusionRegexps.Name], m.GetInclusionRegexps(), requiredStatsRegexps, c.IPs)

	var patterns []*matcherv3.StringMatcher
	add := func(f func(string) *matcherv3.StringMatcher, l ...string) {
		for _, s := range l {
			patterns = append(patterns, f(s))
		}
	}
	prefix := func(s string) *matcherv3.StringMatcher {
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: s}}
	}
	add(prefix, "reporter=")
	if c.MetadataDiscovery {
		add(prefix, "workload_discovery")
	}
	add(prefix, prefixes...)
	add(func(s string) *matcherv3.StringMatcher {
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: s}}
	}, suffixList...)
	add(func(s string) *matcherv3.StringMatcher {
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: s}}}
	}, regexps...)
	add(prefix, "component", "istio")

	buckets, err := histogramBuckets(annos[annotation.SidecarStatsHistogramBuckets.Name])
	if err != nil {
		return nil, err
	}
	return &metricsv3.StatsConfig{
		StatsTags:               tags,
		UseAllDefaultTags:       wrapperspb.Bool(false),
		StatsMatcher:            &metricsv3.StatsMatcher{StatsMatcher: &metricsv3.StatsMatcher_InclusionList{InclusionList: &matcherv3.ListStringMatcher{Patterns: patterns}}},
		HistogramBucketSettings: buckets,
	}, nil
}

// inclusion is the annotation's comma list, else the ProxyConfig's, plus the required ones,
// with {pod_ip} replaced by each of the proxy's IPs.
func inclusion(anno string, fromConfig, required []string, ips []string) []string {
	var l []string
	if anno != "" {
		l = strings.Split(anno, ",")
	} else {
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
	return out
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

func statsTags(extra []string) []*metricsv3.TagSpecifier {
	tag := func(name, re string) *metricsv3.TagSpecifier {
		return &metricsv3.TagSpecifier{TagName: name, TagValue: &metricsv3.TagSpecifier_Regex{Regex: re}}
	}
	tags := []*metricsv3.TagSpecifier{
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
		tags = append(tags, tag(t, `(`+t+`=\.=(.*?);\.;)`))
	}
	return append(tags,
		tag("cache", `(cache\.(.+?)\.)`),
		tag("component", `(component\.(.+?)\.)`),
		tag("tag", `(tag\.(.+?);\.)`),
		tag("wasm_filter", `(wasm_filter\.(.+?)\.)`),
		tag("authz_enforce_result", `rbac(\.(allowed|denied))`),
		tag("authz_dry_run_action", `(\.istio_dry_run_(allow|deny)_)`),
		tag("authz_dry_run_result", `(\.shadow_(allowed|denied))`),
	)
}

// histogramBuckets parses sidecar.istio.io/statsHistogramBuckets: {"prefix": [bounds...]}.
func histogramBuckets(anno string) ([]*metricsv3.HistogramBucketSettings, error) {
	if anno == "" {
		return nil, nil
	}
	var m map[string][]float64
	if err := json.Unmarshal([]byte(anno), &m); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", annotation.SidecarStatsHistogramBuckets.Name, err)
	}
	var out []*metricsv3.HistogramBucketSettings
	for _, p := range sortedKeys(m) {
		out = append(out, &metricsv3.HistogramBucketSettings{
			Match:   &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: p}},
			Buckets: m[p],
		})
	}
	return out, nil
}

// statsTiming applies sidecar.istio.io/statsFlushInterval and statsEvictionInterval.
func statsTiming(b *bootstrapv3.Bootstrap, annos map[string]string) error {
	flush := 5 * time.Second // Envoy's default
	if v, ok := annos[annotation.SidecarStatsFlushInterval.Name]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("annotation %s=%q: %w", annotation.SidecarStatsFlushInterval.Name, v, err)
		}
		flush = d
		b.StatsFlushInterval = durationpb.New(d)
	}
	if v, ok := annos[annotation.SidecarStatsEvictionInterval.Name]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("annotation %s=%q: %w", annotation.SidecarStatsEvictionInterval.Name, v, err)
		}
		if d <= 0 || d%flush != 0 {
			return fmt.Errorf("annotation %s=%q: must be a positive multiple of the stats flush interval %v", annotation.SidecarStatsEvictionInterval.Name, v, flush)
		}
		b.StatsEviction = &bootstrapv3.Bootstrap_StatsEvictionInterval{StatsEvictionInterval: durationpb.New(d)}
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
func httpListener(addr, additional string, port int, statPrefix, pathPrefix, cluster string, compress bool) *listenerv3.Listener {
	var filters []*hcmv3.HttpFilter
	if compress {
		for _, lib := range []struct {
			name string
			cfg  proto.Message
		}{{"brotli", &brotliv3.Brotli{}}, {"gzip", &gzipv3.Gzip{}}, {"zstd", &zstdv3.Zstd{}}} {
			filters = append(filters, &hcmv3.HttpFilter{
				Name: "envoy.filters.http.compressor",
				ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&compressorv3.Compressor{
					CompressorLibrary: &corev3.TypedExtensionConfig{Name: lib.name, TypedConfig: mustAny(lib.cfg)},
					ChooseFirst:       true,
				})},
			})
		}
	}
	filters = append(filters, &hcmv3.HttpFilter{
		Name:       "envoy.filters.http.router",
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
	})
	hcm := &hcmv3.HttpConnectionManager{
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		StatPrefix: statPrefix,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    "backend",
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: pathPrefix}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}},
				}},
			}},
		}},
		HttpFilters: filters,
	}
	l := &listenerv3.Listener{
		Address: socketAddress(addr, port),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name:       "envoy.filters.network.http_connection_manager",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)},
		}}}},
	}
	if additional != "" {
		l.AdditionalAddresses = []*listenerv3.AdditionalAddress{{Address: socketAddress(additional, port)}}
	}
	return l
}

// dnsCluster is a STRICT_DNS cluster for a host:port outside the proxy.
func dnsCluster(name, hostPort string, fam ipFamily) (*clusterv3.Cluster, error) {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return nil, fmt.Errorf("%s address %q: %w", name, hostPort, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%s address %q: bad port", name, hostPort)
	}
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		RespectDnsTtl:        true,
		DnsLookupFamily:      fam.dnsLookup,
		ConnectTimeout:       durationpb.New(time.Second),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		LoadAssignment:       loadAssignment(name, socketAddress(host, int(p))),
	}, nil
}

// tracingConfig returns the tracer's cluster and Envoy's tracing, when one is configured.
func tracingConfig(pc *meshv1.ProxyConfig, fam ipFamily, serviceName string) ([]*clusterv3.Cluster, *tracev3.Tracing, error) {
	t := pc.GetTracing()
	if t == nil || t.Tracer == nil {
		return nil, nil, nil
	}
	if t.GetTlsSettings() != nil {
		return nil, nil, errors.New("tracing.tlsSettings is not supported by agentd's bootstrap")
	}
	var name, cluster, addr string
	var cfg proto.Message
	switch tr := t.Tracer.(type) {
	case *meshv1.Tracing_Zipkin_:
		name, cluster, addr = "envoy.tracers.zipkin", "zipkin", tr.Zipkin.GetAddress()
		cfg = &tracev3.ZipkinConfig{
			CollectorCluster:         cluster,
			CollectorEndpoint:        "/api/v2/spans",
			CollectorEndpointVersion: tracev3.ZipkinConfig_HTTP_JSON,
			TraceId_128Bit:           true,
			SharedSpanContext:        wrapperspb.Bool(false),
		}
	case *meshv1.Tracing_Datadog_:
		name, cluster, addr = "envoy.tracers.datadog", "datadog_agent", tr.Datadog.GetAddress()
		cfg = &tracev3.DatadogConfig{CollectorCluster: cluster, ServiceName: serviceName}
	default:
		return nil, nil, fmt.Errorf("tracer %T is not supported by agentd's bootstrap (zipkin or datadog)", t.Tracer)
	}
	if addr == "" {
		return nil, nil, nil
	}
	c, err := dnsCluster(cluster, addr, fam)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %w", err)
	}
	if cluster == "zipkin" {
		c.DnsRefreshRate = durationpb.New(30 * time.Second)
	}
	return []*clusterv3.Cluster{c}, &tracev3.Tracing{Http: &tracev3.Tracing_Http{
		Name:       name,
		ConfigType: &tracev3.Tracing_Http_TypedConfig{TypedConfig: mustAny(cfg)},
	}}, nil
}

// remoteServices adds the metrics service, access log service and statsd sinks.
func remoteServices(b *bootstrapv3.Bootstrap, pc *meshv1.ProxyConfig, fam ipFamily) error {
	for _, rs := range []struct {
		name string
		svc  *meshv1.RemoteService
	}{{"envoy_metrics_service", pc.GetEnvoyMetricsService()}, {"envoy_accesslog_service", pc.GetEnvoyAccessLogService()}} {
		if rs.svc.GetAddress() == "" {
			continue
		}
		if rs.svc.GetTlsSettings() != nil {
			return fmt.Errorf("%s tlsSettings is not supported by agentd's bootstrap", rs.name)
		}
		c, err := dnsCluster(rs.name, rs.svc.GetAddress(), fam)
		if err != nil {
			return err
		}
		if ka := rs.svc.GetTcpKeepalive(); ka != nil {
			tk := &corev3.TcpKeepalive{}
			if ka.Probes > 0 {
				tk.KeepaliveProbes = wrapperspb.UInt32(ka.Probes)
			}
			if ka.Time != nil {
				tk.KeepaliveTime = wrapperspb.UInt32(uint32(ka.Time.AsDuration().Seconds()))
			}
			if ka.Interval != nil {
				tk.KeepaliveInterval = wrapperspb.UInt32(uint32(ka.Interval.AsDuration().Seconds()))
			}
			c.UpstreamConnectionOptions = &clusterv3.UpstreamConnectionOptions{TcpKeepalive: tk}
		}
		b.StaticResources.Clusters = append(b.StaticResources.Clusters, grpcCluster(c))
	}
	if pc.GetEnvoyMetricsService().GetAddress() != "" {
		b.StatsSinks = append(b.StatsSinks, &metricsv3.StatsSink{
			Name: "envoy.stat_sinks.metrics_service",
			ConfigType: &metricsv3.StatsSink_TypedConfig{TypedConfig: mustAny(&metricsv3.MetricsServiceConfig{
				TransportApiVersion: corev3.ApiVersion_V3,
				GrpcService: &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "envoy_metrics_service"},
				}},
			})},
		})
	}
	if a := pc.GetStatsdUdpAddress(); a != "" {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return fmt.Errorf("statsdUdpAddress %q: %w", a, err)
		}
		p, _ := strconv.ParseUint(port, 10, 16)
		if net.ParseIP(host) == nil { // Envoy needs an IP; Istio resolves the name at start
			ips, err := net.LookupIP(host)
			if err != nil || len(ips) == 0 {
				return fmt.Errorf("statsdUdpAddress %q: resolve %s: %v", a, host, err)
			}
			host = ips[0].String()
		}
		addr := socketAddress(host, int(p))
		addr.GetSocketAddress().Protocol = corev3.SocketAddress_UDP
		b.StatsSinks = append(b.StatsSinks, &metricsv3.StatsSink{
			Name: "envoy.stat_sinks.statsd",
			ConfigType: &metricsv3.StatsSink_TypedConfig{TypedConfig: mustAny(&metricsv3.StatsdSink{
				StatsdSpecifier: &metricsv3.StatsdSink_Address{Address: addr},
			})},
		})
	}
	return nil
}
