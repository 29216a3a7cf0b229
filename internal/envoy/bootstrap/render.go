package bootstrap

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	"sigs.k8s.io/yaml"
)

// DefaultTemplate is where Istio's proxy image ships its bootstrap template, relative to the
// root (pilot-agent's working directory).
const DefaultTemplate = "./var/lib/istio/envoy/envoy_bootstrap_tmpl.json"

// TemplatePath is the template pilot-agent renders: ISTIO_BOOTSTRAP (the variable), else
// the ProxyConfig's proxyBootstrapTemplatePath (which --templateFile sets), else Istio's
// default. explicit says whether it was named: a named template that is missing is an
// error, the default one missing means agentd's own bootstrap.
func TemplatePath(istioBootstrapEnv, proxyBootstrapTemplatePath string) (p string, explicit bool) {
	switch {
	case istioBootstrapEnv != "":
		return istioBootstrapEnv, true
	case proxyBootstrapTemplatePath != "":
		return proxyBootstrapTemplatePath, true
	}
	return DefaultTemplate, false
}

// OutputFile is where pilot-agent writes the bootstrap rendered from template: envoy-rev.json
// in the ProxyConfig's configPath, envoy-rev.yaml for a YAML template (Envoy reads the
// format from the extension).
func OutputFile(configPath, template string) string {
	suffix := "json"
	if strings.HasSuffix(template, ".yaml.tmpl") || strings.HasSuffix(template, ".yaml") {
		suffix = "yaml"
	}
	return path.Join(configPath, "envoy-rev."+suffix)
}

// Render renders the bootstrap template text as pilot-agent does: Go text/template with
// sprig's generic functions and toJSON, given the option set Istio's pkg/bootstrap computes
// for c (see params). The result is the template's output, unchanged: what Envoy reads.
func Render(c *Config, text []byte) ([]byte, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	t, err := template.New("bootstrap").Funcs(template.FuncMap{"toJSON": toJSON}).Funcs(sprig.GenericFuncMap()).Parse(string(text))
	if err != nil {
		return nil, fmt.Errorf("parse the bootstrap template: %w", err)
	}
	d, err := c.derive()
	if err != nil {
		return nil, err
	}
	params, err := d.params()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, params); err != nil {
		return nil, fmt.Errorf("render the bootstrap template: %w", err)
	}
	return buf.Bytes(), nil
}

// RenderFile renders the template at templatePath and writes it to out (atomically, 0644),
// with the files it names, as Write does.
func RenderFile(c *Config, templatePath, out string) error {
	text, err := os.ReadFile(templatePath)
	if err != nil {
		return fmt.Errorf("bootstrap template: %w", err)
	}
	data, err := Render(c, text)
	if err != nil {
		return fmt.Errorf("bootstrap template %s: %w", templatePath, err)
	}
	return writeFiles(c, out, data)
}

// AsJSON is a rendered bootstrap as JSON: Envoy reads a .json file that is not strict JSON
// (Istio's template has a trailing comma in one branch) as YAML, and so does this.
func AsJSON(rendered []byte) ([]byte, error) {
	if json.Valid(rendered) {
		return rendered, nil
	}
	js, err := yaml.YAMLToJSON(rendered)
	if err != nil {
		return nil, fmt.Errorf("the rendered bootstrap is neither JSON nor YAML: %w", err)
	}
	return js, nil
}

// toJSON is Istio's template function of that name: {} for nil or what does not encode.
func toJSON(v any) string {
	if v == nil {
		return "{}"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "{}"
	}
	return string(b)
}

// params is the option set of Istio's pkg/bootstrap (option names and values, as
// toTemplateParams builds them), from the same decisions as agentd's own bootstrap. Options
// Istio skips when zero are left out, so that a template's {{ if }} sees them as Istio's does.
// Istio's .metadata (its Go struct) is the metadata map here, keyed by the JSON names.
func (d *derived) params() (map[string]any, error) {
	p := params{}
	if err := d.nodeParams(p); err != nil {
		return nil, err
	}
	d.statsParams(p)
	d.networkParams(p)
	if err := d.serviceParams(p); err != nil {
		return nil, err
	}
	return p, nil
}

// params is a template's option set.
type params map[string]any

func (p params) set(name string, v any) { p[name] = v }

// setIf sets an option Istio skips when it is zero.
func (p params) setIf(name string, v any, ok bool) {
	if ok {
		p[name] = v
	}
}

// nodeParams: the node (id, type, locality, metadata), the xDS and SDS choices.
func (d *derived) nodeParams(p params) error {
	c, pc := d.c, d.c.ProxyConfig
	meta, err := json.Marshal(d.meta)
	if err != nil {
		return fmt.Errorf("encode node metadata: %w", err)
	}
	var sans []string
	sanList, _ := d.meta["PILOT_SAN"].([]any)
	for _, s := range sanList {
		sans = append(sans, `{"exact":"`+stringOf(s)+`"}`)
	}
	p.set("nodeID", c.NodeID())
	p.set("nodeType", string(c.Type))
	p.set("pilot_SAN", "["+strings.Join(sans, ",")+"]")
	p.setIf("outlier_log_path", c.OutlierLogPath, c.OutlierLogPath != "")
	p.setIf("custom_file_path", fileCredentialSocket, d.customFile)
	p.set("log_json", c.LogAsJSON)
	p.set("discovery_host", strings.Split(pc.DiscoveryAddress, ":")[0])
	p.set("metadata", d.meta)
	p.set("xds_type", d.xdsType)
	p.set("metadata_discovery", d.metaDisc)
	p.set("metrics_localhost_access_only", d.localhostOnly)
	if c.StsPort > 0 {
		p.set("sts", true)
		p.set("sts_port", c.StsPort)
	}
	p.set("workload_identity_socket_file", c.sdsSocketFile())

	loc := d.node.GetLocality()
	p.setIf("region", loc.GetRegion(), loc.GetRegion() != "")
	p.setIf("zone", loc.GetZone(), loc.GetZone() != "")
	p.setIf("sub_zone", loc.GetSubZone(), loc.GetSubZone() != "")
	p.set("meta_json_str", string(meta))
	return nil
}

// statsParams: the stats inclusion list, tags, buckets and intervals, the runtime layer and
// the ports and limit of the static listeners.
func (d *derived) statsParams(p params) {
	c := d.c
	runtime, _ := json.Marshal(d.runtime) // strings and booleans
	p.setIf("inclusionPrefix", d.prefixes, len(d.prefixes) > 0)
	p.setIf("inclusionSuffix", d.suffixes, len(d.suffixes) > 0)
	p.setIf("inclusionRegexps", d.regexps, len(d.regexps) > 0)
	p.setIf("extraStatTags", d.extraTags, len(d.extraTags) > 0)
	type match struct {
		Prefix string `json:"prefix"`
	}
	type bucket struct {
		Match   match     `json:"match"`
		Buckets []float64 `json:"buckets"`
	}
	var buckets []bucket
	for _, b := range d.buckets {
		buckets = append(buckets, bucket{Match: match{b.Prefix}, Buckets: b.Buckets})
	}
	p.set("histogram_buckets", buckets)
	p.setIf("stats_flush_interval", d.flush, d.flush != 0)
	p.setIf("stats_eviction_interval", strconv.FormatInt(int64(d.eviction.Seconds()), 10)+"s", d.eviction != 0)
	p.set("runtime_flags", string(runtime))
	p.set("envoy_status_port", c.statusPort())
	p.set("envoy_prometheus_port", c.prometheusPort())
	p.set("global_downstream_max_connections", d.maxConns)

}

// networkParams: the proxy's IP families.
func (d *derived) networkParams(p params) {
	p.set("localhost", d.fam.localhost)
	p.set("wildcard", d.fam.wildcard)
	p.set("dns_lookup_family", d.fam.dnsLookup)
	if d.fam.dualStack {
		p.set("additional_localhost", d.fam.additionalLocalhost)
		p.set("additional_wildcard", d.fam.additionalWildcard)
		p.set("dual_stack", true)
	}
	p.setIf("envoy_status_port_enable_proxy_protocol", true, d.c.StatusPortProxyProtocol)
	p.setIf("enable_self_discovery", true, d.selfDisc)
}

// serviceParams: the ProxyConfig and what it names outside the proxy: the discovery
// address, statsd, the tracer and the metrics and access log services.
func (d *derived) serviceParams(p params) error {
	c, pc := d.c, d.c.ProxyConfig
	p.set("config", pc)
	p.set("cluster", d.node.GetCluster())
	if pc.DiscoveryAddress != "" {
		a, err := d.address("discoveryAddress", pc.DiscoveryAddress)
		if err != nil {
			return err
		}
		p.set("pilot_grpc_address", a.option())
	}
	p.set("discovery_address", pc.DiscoveryAddress)
	if d.statsd != nil {
		p.set("statsd", d.statsd.option())
	}
	p.set("xds_root_cert", c.getenv("XDS_ROOT_CA"))
	if t := d.tracer; t != nil {
		p.set(t.kind, t.address.option())
		p.setIf("tracing_tls", jsonOption(t.tls), t.tls != nil)
	}
	if pc.GetTracing().GetLightstep() != nil { // Istio names the token file even without an address
		p.set("lightstepToken", lightstepTokenPath(pc))
	}
	if m := d.metrics; m != nil {
		p.set("envoy_metrics_service_address", m.address.option())
		p.setIf("envoy_metrics_service_tls", jsonOption(m.tls), m.tls != nil)
		if ka := keepalive(m.keepalive.GetTcpKeepalive()); ka != nil {
			p.set("envoy_metrics_service_tcp_keepalive", keepaliveOption(ka))
		}
	}
	p.set("envoy_metrics_stats_compression", d.compress)
	if a := d.accessLog; a != nil {
		p.set("envoy_accesslog_service_address", a.address.option())
		p.setIf("envoy_accesslog_service_tls", jsonOption(a.tls), a.tls != nil)
		if ka := keepalive(a.keepalive.GetTcpKeepalive()); ka != nil {
			p.set("envoy_accesslog_service_tcp_keepalive", keepaliveOption(ka))
		}
	}
	p.setIf("load_stats_config_json_str", d.loadStats, d.loadStats != "")
	return nil
}

// option is the address as Istio's addressConverter writes it into the template.
func (a hostPort) option() string {
	return fmt.Sprintf(`{"address": "%s", "port_value": %s}`, a.host, a.port)
}

// jsonOption is a JSON object as a template option's text.
func jsonOption(o object) string {
	b, _ := json.Marshal(o)
	return string(b)
}

// keepaliveOption is a keepalive as the template's upstream_connection_options.
func keepaliveOption(ka object) string {
	b, _ := json.Marshal(object{"tcp_keepalive": ka})
	return string(b)
}
