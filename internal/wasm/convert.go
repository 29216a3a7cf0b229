package wasm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	udpav1 "github.com/cncf/xds/go/udpa/type/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Type URLs of what an ECDS resource may carry.
const (
	ExtensionConfigType = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
	httpWasmType        = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
	networkWasmType     = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm"
	typedStructType     = "type.googleapis.com/udpa.type.v1.TypedStruct"
)

// Environment variables istiod passes to the agent in the VM config; every ISTIO_META_ one
// is removed before Envoy sees the filter.
const (
	metaPrefix      = "ISTIO_META_"
	secretEnv       = "ISTIO_META_WASM_IMAGE_PULL_SECRET"
	policyEnv       = "ISTIO_META_WASM_IMAGE_PULL_POLICY"
	resourceVersEnv = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"
)

// Stat prefixes of the RBAC filters that replace a module that cannot be fetched.
const (
	allowStatPrefix = "wasm-default-allow"
	denyStatPrefix  = "wasm-default-deny"
)

// Converter rewrites ECDS resources whose Wasm code is remote to load the cached file.
type Converter struct{ cache *Cache }

// NewConverter returns a converter fetching through c.
func NewConverter(c *Cache) *Converter { return &Converter{cache: c} }

// Convert rewrites resources in place, each in parallel. A module that cannot be fetched is
// replaced by an allow-all RBAC filter of the same name when its failure policy is
// FAIL_OPEN, else by a deny-all one; the error returned (the whole response is then NACKed,
// as Istio does) is only for resources that do not decode or cannot be re-encoded.
func (cv *Converter) Convert(ctx context.Context, resources []*anypb.Any) error {
	start := time.Now()
	defer func() {
		cv.cache.metrics.conversionDuration.WithLabelValues().Observe(float64(time.Since(start).Milliseconds()))
	}()
	errs := make([]error, len(resources))
	var wg sync.WaitGroup
	for i := range resources {
		wg.Go(func() {
			out, err := cv.convert(ctx, resources[i])
			if err != nil {
				errs[i] = err
			} else if out != nil {
				resources[i] = out
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// filter is a decoded Wasm filter: its plugin config and how to encode it again.
type filter struct {
	config *wasmv3.PluginConfig
	msg    proto.Message // *httpwasm.Wasm or *netwasm.Wasm, holding config
	http   bool
}

// convert returns the rewritten resource, nil to keep it as it is, or an error to NACK.
func (cv *Converter) convert(ctx context.Context, res *anypb.Any) (*anypb.Any, error) {
	ec, f, err := decode(res)
	if err != nil {
		cv.cache.metrics.conversions.WithLabelValues(unmarshalFailure).Inc()
		return nil, err
	}
	if f == nil {
		cv.cache.metrics.conversions.WithLabelValues(noRemoteLoad).Inc()
		return nil, nil
	}
	status, err := cv.fetch(ctx, ec.GetName(), f.config)
	var out *anypb.Any
	if err == nil {
		if ec.TypedConfig, err = anypb.New(f.msg); err == nil {
			out, err = anypb.New(ec)
		}
		if err != nil {
			status = marshalFailure
			err = fmt.Errorf("encoding the rewritten filter %s: %w", ec.GetName(), err)
		}
	}
	cv.cache.metrics.conversions.WithLabelValues(status).Inc()
	if err == nil {
		return out, nil
	}
	open := failOpen(f.config)
	cv.cache.log.Error("cannot load a Wasm module: applying the fallback RBAC filter", "filter", ec.GetName(), "fail_open", open, "error", err)
	out, ferr := fallback(ec.GetName(), f.http, open)
	if ferr != nil {
		return nil, fmt.Errorf("building the fallback filter of %s: %w", ec.GetName(), ferr)
	}
	return out, nil
}

// decode returns the extension config and, when its code is remote, its Wasm filter.
func decode(res *anypb.Any) (*corev3.TypedExtensionConfig, *filter, error) {
	ec := &corev3.TypedExtensionConfig{}
	if err := res.UnmarshalTo(ec); err != nil {
		return nil, nil, fmt.Errorf("decoding an extension config: %w", err)
	}
	tc := ec.GetTypedConfig()
	if tc == nil {
		return nil, nil, fmt.Errorf("extension config %q has no typed config", ec.GetName())
	}
	typeURL, decodeInto := tc.GetTypeUrl(), func(m proto.Message) error { return tc.UnmarshalTo(m) }
	if typeURL == typedStructType {
		ts := &udpav1.TypedStruct{}
		if err := tc.UnmarshalTo(ts); err != nil {
			return nil, nil, fmt.Errorf("decoding the typed struct of %q: %w", ec.GetName(), err)
		}
		typeURL = ts.GetTypeUrl()
		decodeInto = func(m proto.Message) error {
			j, err := protojson.Marshal(ts.GetValue())
			if err == nil {
				err = protojson.Unmarshal(j, m)
			}
			return err
		}
	}
	var f *filter
	switch typeURL {
	case httpWasmType:
		m := &httpwasm.Wasm{}
		f = &filter{msg: m, http: true}
		if err := decodeInto(m); err != nil {
			return nil, nil, fmt.Errorf("decoding the HTTP Wasm filter %q: %w", ec.GetName(), err)
		}
		f.config = m.GetConfig()
	case networkWasmType:
		m := &netwasm.Wasm{}
		f = &filter{msg: m}
		if err := decodeInto(m); err != nil {
			return nil, nil, fmt.Errorf("decoding the network Wasm filter %q: %w", ec.GetName(), err)
		}
		f.config = m.GetConfig()
	default:
		return ec, nil, nil // not Wasm
	}
	code := f.config.GetVmConfig().GetCode()
	switch {
	case code.GetRemote() != nil:
		return ec, f, nil
	case code.GetLocal() != nil:
		return ec, nil, nil
	}
	return nil, nil, fmt.Errorf("wasm filter %q has neither remote nor local code", ec.GetName())
}

// fetch replaces the remote code of pc by the cached file, and strips istiod's ISTIO_META_
// variables; it returns the conversion's metric result.
func (cv *Converter) fetch(ctx context.Context, resource string, pc *wasmv3.PluginConfig) (string, error) {
	vm := pc.GetVmConfig()
	var o GetOptions
	o.ResourceName = resource // istiod names the ECDS resource after the WasmPlugin
	if env := vm.GetEnvironmentVariables(); env != nil {
		if s, ok := env.KeyValues[secretEnv]; ok {
			if s == "" {
				return fetchFailure, fmt.Errorf("fetching Wasm module %s: empty image pull secret", pc.GetName())
			}
			o.PullSecret = []byte(s)
		}
		o.PullPolicy = pullPolicies[env.KeyValues[policyEnv]]
		o.ResourceVersion = env.KeyValues[resourceVersEnv]
		for k := range env.KeyValues {
			if strings.HasPrefix(k, metaPrefix) {
				delete(env.KeyValues, k)
			}
		}
		if len(env.KeyValues) == 0 {
			if len(env.HostEnvKeys) == 0 {
				vm.EnvironmentVariables = nil
			} else {
				env.KeyValues = nil
			}
		}
	}
	remote := vm.GetCode().GetRemote()
	uri := remote.GetHttpUri()
	if uri == nil {
		return missRemoteFetchHint, fmt.Errorf("wasm module %s: remote code without an http_uri", pc.GetName())
	}
	if o.Checksum = remote.GetSha256(); o.Checksum == "nil" { // istiod's "not set"
		o.Checksum = ""
	}
	if t := uri.GetTimeout(); t != nil {
		o.Timeout = t.AsDuration()
	}
	path, err := cv.cache.Get(ctx, uri.GetUri(), o)
	if err != nil {
		return fetchFailure, fmt.Errorf("fetching Wasm module %s: %w", uri.GetUri(), err)
	}
	vm.Code = &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{
		Local: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: path}},
	}}
	return conversionSuccess, nil
}

// failOpen is the filter's failure policy, or its deprecated fail_open when unspecified.
func failOpen(pc *wasmv3.PluginConfig) bool {
	if p := pc.GetFailurePolicy(); p != wasmv3.FailurePolicy_UNSPECIFIED {
		return p == wasmv3.FailurePolicy_FAIL_OPEN
	}
	return pc.GetFailOpen() //nolint:staticcheck // deprecated, still honoured as Istio does
}

// The RBAC filters that replace a module, encoded here rather than through Envoy's RBAC
// protos: those pull in the route, matcher and CEL protos, whose registration every agentd
// process would pay for at start (about 400 KB of heap each). The tests decode them with the
// real protos.
const (
	httpRBACType    = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
	networkRBACType = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC"
	rbacRulesField  = 1 // both: rules (envoy.config.rbac.v3.RBAC)
	httpStatField   = 6 // http: rules_stat_prefix
	netStatField    = 3 // network: stat_prefix
)

// fallback is the RBAC filter named like the module's: no rules allow everything, empty
// rules (no policies) deny everything.
func fallback(name string, http, open bool) (*anypb.Any, error) {
	typeURL, statField, prefix := networkRBACType, protowire.Number(netStatField), allowStatPrefix
	if http {
		typeURL, statField = httpRBACType, httpStatField
	}
	var b []byte
	if !open {
		prefix = denyStatPrefix
		b = protowire.AppendTag(b, rbacRulesField, protowire.BytesType)
		b = protowire.AppendBytes(b, nil)
	}
	b = protowire.AppendTag(b, statField, protowire.BytesType)
	b = protowire.AppendString(b, prefix)
	return anypb.New(&corev3.TypedExtensionConfig{Name: name, TypedConfig: &anypb.Any{TypeUrl: typeURL, Value: b}})
}
