package devplane

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// WasmPlugin is one of Istio's WasmPlugin resources, served to Envoy clients over ECDS as
// istiod serves it: an HTTP Wasm filter whose code is remote, for the agent to fetch.
type WasmPlugin struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"` // default "default"
	URL       string `json:"url"`                 // oci://, http(s):// or file://; no scheme means oci://
	SHA256    string `json:"sha256,omitempty"`
	// FailStrategy is FAIL_CLOSE (the default) or FAIL_OPEN.
	FailStrategy string `json:"failStrategy,omitempty"`
	// ImagePullPolicy is IfNotPresent or Always; empty is Istio's default.
	ImagePullPolicy string `json:"imagePullPolicy,omitempty"`
}

// wasmResourcePrefix is the prefix istiod gives the ECDS resource of a plugin.
const wasmResourcePrefix = "extensions.istio.io/trafficextension/"

func (w *WasmPlugin) check() error {
	if w.Name == "" {
		return fmt.Errorf("no name")
	}
	if w.Namespace == "" {
		w.Namespace = "default"
	}
	u, err := url.Parse(w.URL)
	if err != nil || w.URL == "" {
		return fmt.Errorf("url %q: not a URL", w.URL)
	}
	switch u.Scheme {
	case "":
		w.URL = "oci://" + w.URL
	case "oci", "http", "https", "file":
	default:
		return fmt.Errorf("url %q: scheme %q (want oci, http, https or file)", w.URL, u.Scheme)
	}
	switch w.FailStrategy {
	case "":
		w.FailStrategy = "FAIL_CLOSE"
	case "FAIL_CLOSE", "FAIL_OPEN":
	default:
		return fmt.Errorf("failStrategy %q (want FAIL_CLOSE or FAIL_OPEN)", w.FailStrategy)
	}
	switch w.ImagePullPolicy {
	case "", "IfNotPresent", "Always":
	default:
		return fmt.Errorf("imagePullPolicy %q (want IfNotPresent or Always)", w.ImagePullPolicy)
	}
	return nil
}

// ResourceName is the plugin's ECDS resource name.
func (w WasmPlugin) ResourceName() string { return wasmResourcePrefix + w.Namespace + "." + w.Name }

// extensionConfig is the plugin's ECDS resource, as istiod builds it: remote code with a
// 30 s timeout, the resource version and pull policy for the agent in ISTIO_META_ variables.
func (w WasmPlugin) extensionConfig(version string) *corev3.TypedExtensionConfig {
	code := &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{
		HttpUri: &corev3.HttpUri{
			Uri:              w.URL,
			Timeout:          durationpb.New(30 * time.Second),
			HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: "_"}, // the agent fetches it
		},
		Sha256: w.SHA256,
	}}}
	if path, ok := strings.CutPrefix(w.URL, "file://"); ok {
		code = &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{Local: &corev3.DataSource{
			Specifier: &corev3.DataSource_Filename{Filename: path},
		}}}
	}
	env := map[string]string{"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": version}
	if w.ImagePullPolicy != "" {
		env["ISTIO_META_WASM_IMAGE_PULL_POLICY"] = w.ImagePullPolicy
	}
	policy := wasmv3.FailurePolicy_FAIL_CLOSED
	if w.FailStrategy == "FAIL_OPEN" {
		policy = wasmv3.FailurePolicy_FAIL_OPEN
	}
	filter := &httpwasm.Wasm{Config: &wasmv3.PluginConfig{
		Name:          w.Namespace + "." + w.Name,
		FailurePolicy: policy,
		Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{
			Runtime:              "envoy.wasm.runtime.v8",
			Code:                 code,
			EnvironmentVariables: &wasmv3.EnvironmentVariables{KeyValues: env},
		}},
	}}
	return &corev3.TypedExtensionConfig{Name: w.ResourceName(), TypedConfig: mustAny(filter)}
}

// withPlugins adds the plugins' ECDS resources to an Envoy generator's resources, and to its
// HTTP listeners a filter per plugin, before the router, that fetches the plugin by ECDS (as
// istiod inserts a WasmPlugin, with the RBAC type its fallback has).
func withPlugins(res map[resourcev3.Type][]types.Resource, plugins []WasmPlugin, version string) map[resourcev3.Type][]types.Resource {
	if len(plugins) == 0 {
		return res
	}
	var filters []*hcmv3.HttpFilter
	for _, w := range plugins {
		res[resourcev3.ExtensionConfigType] = append(res[resourcev3.ExtensionConfigType], w.extensionConfig(version))
		filters = append(filters, &hcmv3.HttpFilter{
			Name: w.ResourceName(),
			ConfigType: &hcmv3.HttpFilter_ConfigDiscovery{ConfigDiscovery: &corev3.ExtensionConfigSource{
				ConfigSource: adsSource(),
				TypeUrls:     []string{httpWasmType, httpRBACType},
			}},
		})
	}
	for _, r := range res[resourcev3.ListenerType] {
		for _, fc := range r.(*listenerv3.Listener).GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) != nil {
					continue
				}
				hcm.HttpFilters = append(slices.Clone(filters), hcm.HttpFilters...)
				f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)}
			}
		}
	}
	return res
}

const (
	httpWasmType = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
	httpRBACType = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
)
