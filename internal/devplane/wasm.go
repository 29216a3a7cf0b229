package devplane

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
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

// withPlugins adds the plugins' ECDS resources to an Envoy generator's resources.
func withPlugins(res map[resourcev3.Type][]types.Resource, plugins []WasmPlugin, version string) map[resourcev3.Type][]types.Resource {
	for _, w := range plugins {
		res[resourcev3.ExtensionConfigType] = append(res[resourcev3.ExtensionConfigType], w.extensionConfig(version))
	}
	return res
}
