package bootstrap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	meshv1 "istio.io/api/mesh/v1alpha1"
	networkingv1 "istio.io/api/networking/v1alpha3"
)

// File is where pilot-agent writes Envoy's bootstrap, relative to the root.
const File = "etc/istio/proxy/envoy-rev.json"

// Build generates agentd's own bootstrap from c, as indented JSON: what Istio's template
// (pilot-agent's envoy_bootstrap_tmpl.json of the Istio release agentd is built for) renders
// for the same settings. Render renders a mesh's own template instead.
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
	d, err := c.derive()
	if err != nil {
		return nil, err
	}
	doc, err := d.bootstrap()
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

// Write generates the bootstrap and writes it to path (atomically, 0644), with the files it
// names (see writeFiles).
func Write(c *Config, path string) error {
	data, err := Build(c)
	if err != nil {
		return err
	}
	return writeFiles(c, path, data)
}

// writeFiles writes the bootstrap data to path and, first, the files the bootstrap names
// beside it, as pilot-agent does at each bootstrap write: with a Lightstep tracer, the access
// token in LightstepTokenFile. path is the bootstrap in the ProxyConfig's configPath under
// Envoy's working directory, so the token file is where the bootstrap's relative name points.
func writeFiles(c *Config, path string, data []byte) error {
	if ls := c.ProxyConfig.GetTracing().GetLightstep(); ls != nil {
		// A secret: only Envoy, a child of agentd under its user, reads it (Istio: 0666).
		if err := writeAtomic(filepath.Join(filepath.Dir(path), LightstepTokenFile), []byte(ls.GetAccessToken()), 0o600); err != nil {
			return fmt.Errorf("write Lightstep's access token: %w", err)
		}
	}
	if err := writeAtomic(path, data, 0o644); err != nil {
		return fmt.Errorf("write bootstrap: %w", err)
	}
	return nil
}

// writeAtomic writes data to path through a temporary file and a rename, so that a reader
// sees the old file or the new one.
func writeAtomic(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
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

// bootstrap is the document, section by section in the template's order.
func (d *derived) bootstrap() (object, error) {
	nodeJSON, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(d.node)
	if err != nil {
		return nil, fmt.Errorf("encode node: %w", err)
	}
	b := object{
		"application_log_config": d.applicationLog(),
		"node":                   json.RawMessage(nodeJSON),
		"layered_runtime": object{"layers": []object{
			{"name": "global config", "static_layer": d.runtime},
			{"name": "admin", "admin_layer": object{}},
		}},
		"bootstrap_extensions": d.bootstrapExtensions(),
		"stats_config":         d.statsConfig(),
		"admin":                d.admin(),
		"dynamic_resources":    d.dynamicResources(),
		"static_resources": object{
			"clusters":  d.clusters(),
			"listeners": []object{d.prometheusListener(), d.readinessListener()},
		},
		"overload_manager": object{"resource_monitors": []object{extension(
			"envoy.resource_monitors.global_downstream_max_connections",
			"envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
			object{"max_active_downstream_connections": d.maxConns})}},
		"deferred_stat_options": object{"enable_deferred_creation_stats": true},
	}
	if d.flush != 0 {
		b["stats_flush_interval"] = duration(d.flush)
	}
	if d.eviction != 0 {
		b["stats_eviction_interval"] = duration(d.eviction)
	}
	if t := d.tracing(); t != nil {
		b["tracing"] = t
	}
	if sinks := d.statsSinks(); len(sinks) > 0 {
		b["stats_sinks"] = sinks
	}
	cm, err := d.clusterManager()
	if err != nil {
		return nil, err
	}
	if cm != nil {
		b["cluster_manager"] = cm
	}
	return b, nil
}

// applicationLog is Envoy's own log format, as text or (--log_as_json) as JSON.
func (d *derived) applicationLog() object {
	if d.c.LogAsJSON {
		return object{"log_format": object{"json_format": object{
			"time": "%Y-%m-%dT%T.%fZ", "level": "%l", "scope": "envoy %n", "msg": "%j", "caller": "%g:%#", "thread": "%t",
		}}}
	}
	return object{"log_format": object{"text_format": "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"}}
}

func (d *derived) bootstrapExtensions() []object {
	var ext []object
	if d.metaDisc {
		// Istio's proxy extension; its type is not part of Envoy's API, hence a TypedStruct.
		ext = append(ext, extension("metadata_discovery", "udpa.type.v1.TypedStruct", object{
			"type_url": "type.googleapis.com/istio.workload.BootstrapExtension",
			"value":    object{"config_source": object{"ads": object{}}},
		}))
	}
	return append(ext, extension("envoy.bootstrap.internal_listener", "udpa.type.v1.TypedStruct", object{
		"type_url": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener",
		"value":    object{"buffer_size_kb": 64},
	}))
}

func (d *derived) admin() object {
	return object{
		"access_log": []object{extension("envoy.access_loggers.file",
			"envoy.extensions.access_loggers.file.v3.FileAccessLog", object{"path": "/dev/null"})},
		"profile_path": "/var/lib/istio/data/envoy.prof",
		"address":      object{"socket_address": object{"address": d.fam.localhost, "port_value": int(d.c.ProxyConfig.ProxyAdminPort)}},
	}
}

func (d *derived) dynamicResources() object {
	ads := func() object {
		return object{"ads": object{}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}
	}
	return object{
		"lds_config": ads(),
		"cds_config": ads(),
		"ads_config": object{
			"api_type":                       d.xdsType,
			"set_node_on_first_message_only": true,
			"transport_api_version":          "V3",
			"grpc_services":                  []object{envoyGrpc("xds-grpc")},
		},
	}
}

// statsConfig is Istio's tag extraction and inclusion list.
func (d *derived) statsConfig() object {
	var patterns []object
	add := func(key string, l ...string) {
		for _, s := range l {
			patterns = append(patterns, object{key: s})
		}
	}
	add("prefix", "reporter=")
	if d.metaDisc {
		add("prefix", "workload_discovery")
	}
	add("prefix", d.prefixes...)
	add("suffix", d.suffixes...)
	for _, r := range d.regexps {
		patterns = append(patterns, object{"safe_regex": object{"regex": r}})
	}
	add("prefix", "component", "istio")
	sc := object{
		"use_all_default_tags": false,
		"stats_tags":           statsTags(d.extraTags),
		"stats_matcher":        object{"inclusion_list": object{"patterns": patterns}},
	}
	if len(d.buckets) > 0 {
		var settings []object
		for _, b := range d.buckets {
			settings = append(settings, object{"match": object{"prefix": b.Prefix}, "buckets": b.Buckets})
		}
		sc["histogram_bucket_settings"] = settings
	}
	return sc
}

// statsTags are Istio's tag rules, in its order: the names istiod >= 1.23 writes end each
// cluster and listener stat prefix with ";", which the first rules take as the tag's end.
func statsTags(extra []string) []object {
	tag := func(name, re string) object {
		return object{"tag_name": name, "regex": re}
	}
	tags := []object{
		tag("cluster_name", `^cluster(\.(.+);)`),
		tag("http_conn_manager_prefix", `^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)`),
		tag("thread_name", `^server(\.(.+))\.watchdog`),
		tag("tcp_prefix", `^tcp\.((.*?)\.)\w+?$`),
		tag("response_code", `_rq(_(\d{3}))$`),
		tag("response_code_class", `_rq(_(\dxx))$`),
		tag("http_conn_manager_listener_prefix", `^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`),
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

// clusters are the static clusters: Envoy's own stats and the agent, the SDS and xDS
// sockets, then the tracer, the metrics and access log services and the local cluster.
func (d *derived) clusters() []object {
	pc := d.c.ProxyConfig
	tcp := func(port int32) object {
		return object{"socket_address": object{"protocol": "TCP", "address": d.fam.localhost, "port_value": int(port)}}
	}
	clusters := []object{
		staticCluster("prometheus_stats", "0.250s", tcp(pc.ProxyAdminPort)),
		staticCluster("agent", "0.250s", tcp(pc.StatusPort)),
		grpcCluster(staticCluster("sds-grpc", "1s", pipeAddress(sdsSocketDir+d.c.sdsSocketFile()))),
	}
	if d.customFile {
		clusters = append(clusters, grpcCluster(staticCluster("sds-files-grpc", "1s", pipeAddress(fileCredentialSocket))))
	}
	clusters = append(clusters, xdsCluster(pc))
	if t := d.tracer; t != nil {
		var c object
		switch t.kind {
		case "zipkin":
			c = d.dnsCluster("zipkin", t.address)
			c["dns_refresh_rate"] = "30s"
		case "lightstep":
			c = grpcCluster(d.dnsCluster("lightstep", t.address))
		case "datadog":
			c = d.dnsCluster("datadog_agent", t.address)
		}
		if t.tls != nil {
			c["transport_socket"] = t.tls
		}
		clusters = append(clusters, c)
	}
	for _, rs := range []struct {
		name string
		svc  *remoteService
	}{{"envoy_metrics_service", d.metrics}, {"envoy_accesslog_service", d.accessLog}} {
		if rs.svc == nil {
			continue
		}
		c := grpcCluster(d.dnsCluster(rs.name, rs.svc.address))
		if ka := keepalive(rs.svc.keepalive.GetTcpKeepalive()); ka != nil {
			c["upstream_connection_options"] = object{"tcp_keepalive": ka}
		}
		if rs.svc.tls != nil {
			c["transport_socket"] = rs.svc.tls
		}
		clusters = append(clusters, c)
	}
	if d.selfDisc {
		clusters = append(clusters, localCluster())
	}
	return clusters
}

// keepalive is a RemoteService's TCP keepalive, the fields set (seconds), or nil.
func keepalive(ka *networkingv1.ConnectionPoolSettings_TCPSettings_TcpKeepalive) object {
	if ka == nil {
		return nil
	}
	tk := object{}
	if ka.GetProbes() > 0 {
		tk["keepalive_probes"] = ka.GetProbes()
	}
	if s := ka.GetTime().GetSeconds(); s > 0 {
		tk["keepalive_time"] = uint32(s)
	}
	if s := ka.GetInterval().GetSeconds(); s > 0 {
		tk["keepalive_interval"] = uint32(s)
	}
	return tk
}

// localCluster is ENABLE_SELF_DISCOVERY's EDS cluster of the workload's own service.
func localCluster() object {
	return object{
		"name": "local_cluster", "alt_stat_name": "local_cluster;", "type": "EDS", "connect_timeout": "1s",
		"load_balancing_policy": object{"policies": []object{{"typed_extension_config": extension(
			"envoy.load_balancing_policies.least_request",
			"envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
			object{"locality_lb_config": object{"zone_aware_lb_config": object{"min_cluster_size": "1"}}})}}},
		"eds_cluster_config": object{
			"eds_config":   object{"ads": object{}, "resource_api_version": "V3"},
			"service_name": "local_cluster",
		},
	}
}

func pipeAddress(path string) object {
	return object{"pipe": object{"path": path}}
}

func staticCluster(name, timeout string, addr object) object {
	return object{
		"name":            name,
		"alt_stat_name":   name + ";",
		"type":            "STATIC",
		"connect_timeout": timeout,
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
	c := grpcCluster(staticCluster("xds-grpc", "1s", pipeAddress(pc.ConfigPath+"/XDS")))
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

// socketAddress is a host:port of the ProxyConfig as Istio's template writes it.
func (a hostPort) socketAddress() object {
	p, _ := strconv.Atoi(a.port)
	return object{"address": a.host, "port_value": p}
}

// dnsCluster is a STRICT_DNS cluster for a host:port outside the proxy.
func (d *derived) dnsCluster(name string, a hostPort) object {
	return object{
		"name":              name,
		"alt_stat_name":     name + ";",
		"type":              "STRICT_DNS",
		"respect_dns_ttl":   true,
		"dns_lookup_family": d.fam.dnsLookup,
		"connect_timeout":   "1s",
		"lb_policy":         "ROUND_ROBIN",
		"load_assignment":   loadAssignment(name, object{"socket_address": a.socketAddress()}),
	}
}

// tracing is Envoy's HTTP tracer, or nil.
func (d *derived) tracing() object {
	t := d.tracer
	if t == nil {
		return nil
	}
	switch t.kind {
	case "zipkin":
		return object{"http": extension("envoy.tracers.zipkin", "envoy.config.trace.v3.ZipkinConfig", object{
			"collector_cluster":          "zipkin",
			"collector_endpoint":         "/api/v2/spans",
			"collector_endpoint_version": "HTTP_JSON",
			"trace_id_128bit":            true,
			"shared_span_context":        false,
		})}
	case "lightstep":
		return object{"http": extension("envoy.tracers.lightstep", "envoy.config.trace.v3.LightstepConfig", object{
			"collector_cluster": "lightstep", "access_token_file": lightstepTokenPath(d.c.ProxyConfig),
		})}
	default:
		return object{"http": extension("envoy.tracers.datadog", "envoy.config.trace.v3.DatadogConfig", object{
			"collector_cluster": "datadog_agent", "service_name": d.node.GetCluster(),
		})}
	}
}

// statsdLookupTimeout bounds the resolution of statsd's host name at start.
const statsdLookupTimeout = 2 * time.Second

// statsSinks are the metrics service and statsd. Envoy's statsd sink needs an IP: a host
// name is resolved here (Istio's template writes it as given, which Envoy refuses).
func (d *derived) statsSinks() []object {
	var sinks []object
	if d.metrics != nil {
		sinks = append(sinks, extension("envoy.stat_sinks.metrics_service", "envoy.config.metrics.v3.MetricsServiceConfig", object{
			"transport_api_version": "V3",
			"grpc_service":          envoyGrpc("envoy_metrics_service"),
		}))
	}
	if d.statsd != nil {
		a := *d.statsd
		if net.ParseIP(a.host) == nil {
			ctx, cancel := context.WithTimeout(context.Background(), statsdLookupTimeout)
			ips, err := net.DefaultResolver.LookupIPAddr(ctx, a.host)
			cancel()
			if err == nil && len(ips) > 0 {
				a.host = ips[0].IP.String()
			} else {
				d.c.warn("statsdUdpAddress: cannot resolve the host; Envoy will refuse the name", "host", a.host, "error", err)
			}
		}
		sinks = append(sinks, extension("envoy.stat_sinks.statsd", "envoy.config.metrics.v3.StatsdSink", object{
			"address": object{"socket_address": a.socketAddress()},
		}))
	}
	return sinks
}

// clusterManager is the outlier log, the load report and the local cluster's name, or nil.
func (d *derived) clusterManager() (object, error) {
	if d.c.OutlierLogPath == "" && d.loadStats == "" && !d.selfDisc {
		return nil, nil
	}
	cm := object{"enable_deferred_cluster_creation": true}
	if d.selfDisc {
		cm["local_cluster_name"] = "local_cluster"
	}
	if d.c.OutlierLogPath != "" {
		cm["outlier_detection"] = object{"event_log_path": d.c.OutlierLogPath}
	}
	if d.loadStats != "" {
		if !json.Valid([]byte(d.loadStats)) {
			return nil, errors.New("node metadata LOAD_STATS_CONFIG_JSON is not JSON")
		}
		cm["load_stats_config"] = json.RawMessage(d.loadStats)
	}
	return cm, nil
}

// prometheusListener serves /stats/prometheus (ENVOY_PROMETHEUS_PORT), on localhost only
// with METRICS_LOCALHOST_ACCESS_ONLY.
func (d *derived) prometheusListener() object {
	addr, additional := d.fam.wildcard, d.fam.additionalWildcard
	if d.localhostOnly {
		addr, additional = d.fam.localhost, d.fam.additionalLocalhost
	}
	var filters []object
	if d.compress {
		for _, lib := range []struct{ name, typeName string }{
			{"brotli", "envoy.extensions.compression.brotli.compressor.v3.Brotli"},
			{"zstd", "envoy.extensions.compression.zstd.compressor.v3.Zstd"},
			{"gzip", "envoy.extensions.compression.gzip.compressor.v3.Gzip"},
		} {
			filters = append(filters, extension("envoy.filters.http.compressor."+lib.name, "envoy.extensions.filters.http.compressor.v3.Compressor", object{
				"compressor_library": extension("stats_"+lib.name, lib.typeName, nil),
				"response_direction_config": object{"common_config": object{"content_type": []string{
					"text/plain", "application/vnd.google.protobuf", "application/openmetrics-text", "application/openmetrics-protobuf",
				}}},
			}))
		}
	}
	return d.httpListener(addr, additional, d.c.prometheusPort(), "stats", "/stats/prometheus", "prometheus_stats", filters)
}

// readinessListener routes ENVOY_STATUS_PORT's /healthz/ready to the agent, with the proxy
// protocol allowed when ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL is on.
func (d *derived) readinessListener() object {
	l := d.httpListener(d.fam.wildcard, d.fam.additionalWildcard, d.c.statusPort(), "agent", "/healthz/ready", "agent", nil)
	if d.c.StatusPortProxyProtocol {
		l["listener_filters"] = []object{extension("envoy.listener.proxy_protocol",
			"envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol",
			object{"allow_requests_without_proxy_protocol": true})}
	}
	return l
}

// httpListener is a static listener named <addr>_<port> that routes one path prefix to one
// cluster, outside the global connection limit and the overload manager.
func (d *derived) httpListener(addr, additional string, port int, statPrefix, pathPrefix, cluster string, filters []object) object {
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
	tcp := func(host string) object {
		return object{"socket_address": object{"protocol": "TCP", "address": host, "port_value": port}}
	}
	l := object{
		"name":                     addr + "_" + strconv.Itoa(port),
		"address":                  tcp(addr),
		"ignore_global_conn_limit": true,
		"bypass_overload_manager":  true,
		"filter_chains": []object{{"filters": []object{extension("envoy.filters.network.http_connection_manager",
			"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager", hcm)}}},
	}
	if d.fam.dualStack {
		// Istio's template spells it in camel case; Envoy reads both.
		l["additionalAddresses"] = []object{{"address": tcp(additional)}}
	}
	return l
}
