package bootstrap

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"istio.io/api/annotation"
	meshv1 "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"
)

// DefaultProxyConfig is Istio's built-in ProxyConfig (pkg/config/mesh.DefaultProxyConfig).
func DefaultProxyConfig() *meshv1.ProxyConfig {
	return &meshv1.ProxyConfig{
		ConfigPath:               "./etc/istio/proxy",
		ClusterName:              &meshv1.ProxyConfig_ServiceCluster{ServiceCluster: "istio-proxy"},
		DrainDuration:            durationpb.New(45 * time.Second),
		TerminationDrainDuration: durationpb.New(5 * time.Second),
		ProxyAdminPort:           15000,
		ControlPlaneAuthPolicy:   meshv1.AuthenticationPolicy_MUTUAL_TLS,
		DiscoveryAddress:         "istiod.istio-system.svc:15012",
		BinaryPath:               "/usr/local/bin/envoy",
		StatNameLength:           189,
		StatusPort:               15020,
	}
}

// ProxyConfigSources are the places a proxy's ProxyConfig comes from, lowest precedence first.
type ProxyConfigSources struct {
	// MeshConfig is the mesh config file's content (MeshConfig YAML; its defaultConfig applies).
	MeshConfig string
	// Env is the PROXY_CONFIG environment variable (ProxyConfig YAML or JSON).
	Env string
	// Annotations are the pod's annotations: proxy.istio.io/config, then
	// sidecar.istio.io/discoveryAddress and status.sidecar.istio.io/port override.
	Annotations map[string]string
	// ServiceCluster is --serviceCluster; it fills an empty serviceCluster.
	ServiceCluster string
	// Concurrency is --concurrency; above 0 it overrides the ProxyConfig.
	Concurrency int
	// CPULimit is ISTIO_CPU_LIMIT; it fills an unset concurrency.
	CPULimit int
	// Warn, when set, receives what Istio logs and goes on from.
	Warn func(msg string, args ...any)
}

// MergeProxyConfig builds the effective ProxyConfig as pilot-agent does: defaults, the mesh
// config's defaultConfig, PROXY_CONFIG, then the proxy.istio.io/config annotation, each
// overlay replacing the fields it sets (lists replaced, proxyMetadata merged); then the
// discovery-address and status-port annotations; then validation.
func MergeProxyConfig(src ProxyConfigSources) (*meshv1.ProxyConfig, error) {
	pc := DefaultProxyConfig()
	if strings.TrimSpace(src.MeshConfig) != "" {
		def, err := meshDefaultConfig(src.MeshConfig)
		if err != nil {
			return nil, fmt.Errorf("mesh config file: %w", err)
		}
		if def != "" {
			if err := applyProxyConfig(pc, def); err != nil {
				return nil, fmt.Errorf("mesh config file defaultConfig: %w", err)
			}
		}
	}
	if strings.TrimSpace(src.Env) != "" {
		if err := applyProxyConfig(pc, src.Env); err != nil {
			return nil, fmt.Errorf("PROXY_CONFIG: %w", err)
		}
	}
	if v := src.Annotations[annotation.ProxyConfig.Name]; strings.TrimSpace(v) != "" {
		if err := applyProxyConfig(pc, v); err != nil {
			return nil, fmt.Errorf("annotation %s: %w", annotation.ProxyConfig.Name, err)
		}
	}
	if src.Concurrency > 0 {
		pc.Concurrency = wrapperspb.Int32(int32(src.Concurrency))
	} else if pc.Concurrency == nil && src.CPULimit > 0 {
		pc.Concurrency = wrapperspb.Int32(int32(src.CPULimit))
	}
	if sc, ok := pc.ClusterName.(*meshv1.ProxyConfig_ServiceCluster); ok && sc.ServiceCluster == "" {
		name := src.ServiceCluster
		if name == "" {
			name = "istio-proxy"
		}
		pc.ClusterName = &meshv1.ProxyConfig_ServiceCluster{ServiceCluster: name}
	}
	if err := ValidateProxyConfig(pc); err != nil {
		return nil, fmt.Errorf("invalid ProxyConfig: %w", err)
	}
	if v, ok := src.Annotations[annotation.SidecarDiscoveryAddress.Name]; ok {
		pc.DiscoveryAddress = v
	}
	if v, ok := src.Annotations[annotation.SidecarStatusPort.Name]; ok {
		// As Istio's applyAnnotations, after the validation: a value that does not parse is
		// logged and becomes 0, no status server.
		p, err := strconv.Atoi(v)
		if err != nil && src.Warn != nil {
			src.Warn("invalid annotation: no status server, as Istio's agent", "annotation", annotation.SidecarStatusPort.Name, "value", v, "error", err)
		}
		pc.StatusPort = int32(p)
	}
	return pc, nil
}

// meshDefaultConfig returns the defaultConfig of a MeshConfig document as JSON, or "".
func meshDefaultConfig(doc string) (string, error) {
	js, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return "", fmt.Errorf("parse YAML: %w", err)
	}
	mc := &meshv1.MeshConfig{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(js, mc); err != nil {
		return "", fmt.Errorf("parse MeshConfig: %w", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(js, &raw); err != nil {
		return "", fmt.Errorf("parse MeshConfig: %w", err)
	}
	return string(raw["defaultConfig"]), nil
}

// applyProxyConfig overlays a ProxyConfig document (YAML or JSON) onto pc.
func applyProxyConfig(pc *meshv1.ProxyConfig, doc string) error {
	js, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return fmt.Errorf("parse YAML: %w", err)
	}
	if string(js) == "null" {
		return nil
	}
	overlay := &meshv1.ProxyConfig{}
	// Unknown fields are tolerated, as Istio does for configs written by newer versions.
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(js, overlay); err != nil {
		return fmt.Errorf("parse ProxyConfig: %w", err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(js, &keys); err != nil {
		return fmt.Errorf("parse ProxyConfig: %w", err)
	}
	overlayMessage(pc.ProtoReflect(), overlay.ProtoReflect(), keys)
	return nil
}

// overlayMessage sets into dst every top-level field the JSON object keys names, from src
// (its decoding), as Istio's MergeProxyConfig does (golang/protobuf's jsonpb onto the message):
// a field given replaces the field whole — a nested message, a map, a list — and a field given
// as null is left as it was. proxyMetadata is then merged key by key, and the parts of
// proxyHeaders the overlay leaves unset are the earlier ones, as Istio corrects them.
func overlayMessage(dst, src protoreflect.Message, keys map[string]json.RawMessage) {
	pc := dst.Interface().(*meshv1.ProxyConfig)
	origMetadata, origHeaders := pc.ProxyMetadata, pc.ProxyHeaders
	fields := src.Descriptor().Fields()
	for key, raw := range keys {
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByName(protoreflect.Name(key))
		}
		if fd == nil || string(raw) == "null" {
			continue // unknown (tolerated), or null (left as it was)
		}
		switch {
		case src.Has(fd):
			dst.Set(fd, src.Get(fd))
		case fd.ContainingOneof() != nil:
			dst.Set(fd, src.Get(fd)) // a oneof member set to its zero value is still set
		default:
			dst.Clear(fd) // present with its zero value
		}
	}
	pc.ProxyMetadata = mergeMetadata(origMetadata, pc.ProxyMetadata)
	if ph := pc.ProxyHeaders; ph != nil && origHeaders != nil && ph != origHeaders {
		ph.ForwardedClientCert = cmp.Or(ph.ForwardedClientCert, origHeaders.ForwardedClientCert)
		ph.RequestId = cmp.Or(ph.RequestId, origHeaders.RequestId)
		ph.AttemptCount = cmp.Or(ph.AttemptCount, origHeaders.AttemptCount)
		ph.Server = cmp.Or(ph.Server, origHeaders.Server)
		ph.EnvoyDebugHeaders = cmp.Or(ph.EnvoyDebugHeaders, origHeaders.EnvoyDebugHeaders)
	}
}

// mergeMetadata is the earlier proxyMetadata with the overlay's keys set over it.
func mergeMetadata(orig, overlay map[string]string) map[string]string {
	if orig == nil && overlay == nil {
		return nil
	}
	out := maps.Clone(orig)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, overlay)
	return out
}

// ValidateProxyConfig checks the fields agentd relies on, as Istio's
// ValidateMeshConfigProxyConfig does.
func ValidateProxyConfig(pc *meshv1.ProxyConfig) error {
	var errs []error
	if pc.ConfigPath == "" {
		errs = append(errs, errors.New("configPath must be set"))
	}
	if pc.BinaryPath == "" {
		errs = append(errs, errors.New("binaryPath must be set"))
	}
	if err := validateHostPort(pc.DiscoveryAddress); err != nil {
		errs = append(errs, fmt.Errorf("discoveryAddress %q: %w", pc.DiscoveryAddress, err))
	}
	for _, p := range []struct {
		name string
		v    int32
	}{{"proxyAdminPort", pc.ProxyAdminPort}, {"statusPort", pc.StatusPort}} {
		if p.v < 1 || p.v > math.MaxUint16 {
			errs = append(errs, fmt.Errorf("%s %d: must be a port in 1-65535", p.name, p.v))
		}
	}
	if pc.ProxyAdminPort == pc.StatusPort {
		errs = append(errs, fmt.Errorf("proxyAdminPort and statusPort are both %d", pc.StatusPort))
	}
	for _, d := range []struct {
		name string
		v    *durationpb.Duration
	}{{"drainDuration", pc.DrainDuration}, {"terminationDrainDuration", pc.TerminationDrainDuration}, {"fileFlushInterval", pc.FileFlushInterval}} {
		if d.v == nil {
			continue
		}
		if err := d.v.CheckValid(); err != nil || d.v.AsDuration() < 0 {
			errs = append(errs, fmt.Errorf("%s %v: must be a non-negative duration", d.name, d.v))
		}
	}
	if pc.Concurrency != nil && pc.Concurrency.Value < 0 {
		errs = append(errs, fmt.Errorf("concurrency %d: must not be negative", pc.Concurrency.Value))
	}
	if pc.StatNameLength < 0 {
		errs = append(errs, fmt.Errorf("statNameLength %d: must not be negative", pc.StatNameLength))
	}
	if a := pc.StatsdUdpAddress; a != "" {
		if err := validateHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("statsdUdpAddress %q: %w", a, err))
		}
	}
	if a := pc.GetEnvoyMetricsService().GetAddress(); a != "" {
		if err := validateHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("envoyMetricsService.address %q: %w", a, err))
		}
	}
	if a := pc.GetEnvoyAccessLogService().GetAddress(); a != "" {
		if err := validateHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("envoyAccessLogService.address %q: %w", a, err))
		}
	}
	if a := pc.GetTracing().GetZipkin().GetAddress(); a != "" {
		if err := validateHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("tracing.zipkin.address %q: %w", a, err))
		}
	}
	if ls := pc.GetTracing().GetLightstep(); ls != nil { // both required, as Istio's validation
		if err := validateHostPort(ls.GetAddress()); err != nil {
			errs = append(errs, fmt.Errorf("tracing.lightstep.address %q: %w", ls.GetAddress(), err))
		}
		if ls.GetAccessToken() == "" {
			errs = append(errs, errors.New("tracing.lightstep.accessToken is required"))
		}
	}
	if a := pc.GetTracing().GetDatadog().GetAddress(); a != "" {
		if err := validateHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("tracing.datadog.address %q: %w", a, err))
		}
	}
	return errors.Join(errs...)
}

func validateHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("missing host")
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("bad port %q", port)
	}
	return nil
}

// ReadPodInfo reads a downward-API file of `key="quoted value"` lines (the pod's labels or
// annotations). A missing file is an empty map.
func ReadPodInfo(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	m, err := ParseDownwardAPI(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// ParseDownwardAPI parses `key="quoted value"` lines; lines without "=" are skipped.
func ParseDownwardAPI(s string) (map[string]string, error) {
	res := map[string]string{}
	for i, line := range strings.Split(s, "\n") {
		k, q, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v, err := strconv.Unquote(q)
		if err != nil {
			return nil, fmt.Errorf("line %d: value of %q is not a quoted string: %s", i+1, k, q)
		}
		res[k] = v
	}
	return res, nil
}
