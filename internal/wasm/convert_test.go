package wasm

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	udpav1 "github.com/cncf/xds/go/udpa/type/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	httprbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	netwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/agentd/agentd/internal/wasm/wasmtest"
)

func remoteCode(url, sha string) *corev3.AsyncDataSource {
	return &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{
		HttpUri: &corev3.HttpUri{Uri: url, Timeout: durationpb.New(10 * time.Second)},
		Sha256:  sha,
	}}}
}

func localCode(path string) *corev3.AsyncDataSource {
	return &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{Local: &corev3.DataSource{
		Specifier: &corev3.DataSource_Filename{Filename: path},
	}}}
}

func pluginConfig(code *corev3.AsyncDataSource, policy wasmv3.FailurePolicy, env map[string]string) *wasmv3.PluginConfig {
	vm := &wasmv3.VmConfig{Runtime: "envoy.wasm.runtime.v8", Code: code}
	if env != nil {
		vm.EnvironmentVariables = &wasmv3.EnvironmentVariables{KeyValues: env}
	}
	return &wasmv3.PluginConfig{Name: "plugin", FailurePolicy: policy, Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: vm}}
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func extension(t *testing.T, tc proto.Message) *anypb.Any {
	return mustAny(t, &corev3.TypedExtensionConfig{Name: "ns.plugin", TypedConfig: mustAny(t, tc)})
}

func typedStruct(t *testing.T, typeURL string, m proto.Message) *udpav1.TypedStruct {
	t.Helper()
	j, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	s := &structpb.Struct{}
	if err := protojson.Unmarshal(j, s); err != nil {
		t.Fatal(err)
	}
	return &udpav1.TypedStruct{TypeUrl: typeURL, Value: s}
}

func TestConvert(t *testing.T) {
	module := wasmtest.Module("convert")
	srv := wasmtest.Start(t, module)
	dir := t.TempDir()
	c, m := newTestCache(t, Options{Dir: dir})
	httpURL, sum := srv.HTTP+"/plugin.wasm", wasmtest.SHA256(module)
	cached := c.path(moduleKey{name: httpURL, checksum: sum})
	ociURL := "oci://" + srv.Images[wasmtest.Artifact]
	ociCached := c.path(moduleKey{name: moduleName(ociURL), checksum: srv.Digests[wasmtest.Artifact]})
	unreachable := "oci://127.0.0.1:1/wasm/none:v1"

	httpFilter := func(code *corev3.AsyncDataSource, policy wasmv3.FailurePolicy, env map[string]string) *httpwasm.Wasm {
		return &httpwasm.Wasm{Config: pluginConfig(code, policy, env)}
	}
	denyHTTP := &httprbac.RBAC{Rules: &rbacRules, RulesStatPrefix: denyStatPrefix}
	tests := []struct {
		name    string
		in      *anypb.Any
		want    *anypb.Any // nil: unchanged
		result  string     // conversion metric
		wantErr string
	}{
		{name: "http remote", in: extension(t, httpFilter(remoteCode(httpURL, sum), 0, nil)),
			want: extension(t, httpFilter(localCode(cached), 0, nil)), result: conversionSuccess},
		{name: "oci remote, istiod's nil sha256", in: extension(t, httpFilter(remoteCode(ociURL, "nil"), 0, nil)),
			want: extension(t, httpFilter(localCode(ociCached), 0, nil)), result: conversionSuccess},
		{name: "network filter", in: extension(t, &netwasm.Wasm{Config: pluginConfig(remoteCode(httpURL, ""), 0, nil)}),
			want: extension(t, &netwasm.Wasm{Config: pluginConfig(localCode(cached), 0, nil)}), result: conversionSuccess},
		{name: "typed struct", in: extension(t, typedStruct(t, httpWasmType, httpFilter(remoteCode(httpURL, sum), 0, nil))),
			want: extension(t, httpFilter(localCode(cached), 0, nil)), result: conversionSuccess},
		{name: "istio meta env stripped",
			in:   extension(t, httpFilter(remoteCode(httpURL, sum), 0, map[string]string{policyEnv: "Always", resourceVersEnv: "7", "KEEP": "1"})),
			want: extension(t, httpFilter(localCode(cached), 0, map[string]string{"KEEP": "1"})), result: conversionSuccess},
		{name: "wrong sha256 fails closed", in: extension(t, httpFilter(remoteCode(httpURL, strings.Repeat("0", 64)), 0, nil)),
			want: extension(t, denyHTTP), result: fetchFailure},
		{name: "unreachable, FAIL_OPEN", in: extension(t, httpFilter(remoteCode(unreachable, ""), wasmv3.FailurePolicy_FAIL_OPEN, nil)),
			want: extension(t, &httprbac.RBAC{RulesStatPrefix: allowStatPrefix}), result: fetchFailure},
		{name: "unreachable, FAIL_CLOSED", in: extension(t, httpFilter(remoteCode(unreachable, ""), wasmv3.FailurePolicy_FAIL_CLOSED, nil)),
			want: extension(t, denyHTTP), result: fetchFailure},
		{name: "unreachable, deprecated fail_open", in: extension(t, &httpwasm.Wasm{Config: func() *wasmv3.PluginConfig {
			pc := pluginConfig(remoteCode(unreachable, ""), 0, nil)
			pc.FailOpen = true //nolint:staticcheck // the deprecated field is still honoured
			return pc
		}()}), want: extension(t, &httprbac.RBAC{RulesStatPrefix: allowStatPrefix}), result: fetchFailure},
		{name: "network, FAIL_CLOSED", in: extension(t, &netwasm.Wasm{Config: pluginConfig(remoteCode(unreachable, ""), wasmv3.FailurePolicy_FAIL_CLOSED, nil)}),
			want: extension(t, &netrbac.RBAC{Rules: &rbacRules, StatPrefix: denyStatPrefix}), result: fetchFailure},
		{name: "empty pull secret", in: extension(t, httpFilter(remoteCode(ociURL, ""), wasmv3.FailurePolicy_FAIL_OPEN, map[string]string{secretEnv: ""})),
			want: extension(t, &httprbac.RBAC{RulesStatPrefix: allowStatPrefix}), result: fetchFailure},
		{name: "no http_uri", in: extension(t, httpFilter(&corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{}}}, 0, nil)),
			want: extension(t, denyHTTP), result: missRemoteFetchHint},
		{name: "local file untouched", in: extension(t, httpFilter(localCode("/etc/module.wasm"), 0, nil)), result: noRemoteLoad},
		{name: "not wasm untouched", in: extension(t, &httprbac.RBAC{}), result: noRemoteLoad},
		{name: "no code", in: extension(t, httpFilter(nil, 0, nil)), result: unmarshalFailure, wantErr: "neither remote nor local"},
		{name: "not an extension config", in: mustAny(t, &httprbac.RBAC{}), result: unmarshalFailure, wantErr: "decoding"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := value(t, m.conversions.WithLabelValues(tc.result))
			in := proto.Clone(tc.in).(*anypb.Any)
			res := []*anypb.Any{in}
			err := NewConverter(c).Convert(t.Context(), res)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Convert = %v, want an error with %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Convert: %v", err)
			}
			want := tc.want
			if want == nil {
				want = tc.in
			}
			if diff := cmp.Diff(unpack(t, want), unpack(t, res[0]), protocmp.Transform()); diff != "" {
				t.Errorf("Convert (-want +got):\n%s", diff)
			}
			if n := value(t, m.conversions.WithLabelValues(tc.result)) - before; n != 1 {
				t.Errorf("conversions{result=%q} grew by %v, want 1", tc.result, n)
			}
		})
	}
}

// unpack decodes an extension config and its typed config, so that diffs compare content.
func unpack(t *testing.T, a *anypb.Any) []proto.Message {
	ec := &corev3.TypedExtensionConfig{}
	if a.UnmarshalTo(ec) != nil {
		return []proto.Message{a}
	}
	inner, err := ec.GetTypedConfig().UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	return []proto.Message{ec, inner}
}

// FuzzConvert feeds arbitrary ECDS resources to the conversion: it must not panic, and what
// it forwards must decode and never carry remote code. Fetching is not fuzzed: the context is
// cancelled, so every fetch fails at once and takes the fallback path.
func FuzzConvert(f *testing.F) {
	t := &testing.T{}
	for _, m := range []proto.Message{
		&httpwasm.Wasm{Config: pluginConfig(remoteCode("http://127.0.0.1:1/x.wasm", ""), wasmv3.FailurePolicy_FAIL_OPEN, map[string]string{policyEnv: "Always"})},
		&netwasm.Wasm{Config: pluginConfig(remoteCode("oci://127.0.0.1:1/x:latest", "nil"), 0, nil)},
		typedStruct(t, httpWasmType, &httpwasm.Wasm{Config: pluginConfig(remoteCode("https://127.0.0.1:1/x", ""), 0, nil)}),
		&httpwasm.Wasm{Config: pluginConfig(localCode("/x.wasm"), 0, nil)},
	} {
		b, _ := proto.Marshal(extension(t, m))
		f.Add(b)
	}
	c, _ := newTestCache(f, Options{BlockedCIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}})
	ctx, cancel := context.WithCancel(f.Context())
	cancel()
	f.Fuzz(func(t *testing.T, data []byte) {
		res := &anypb.Any{}
		if proto.Unmarshal(data, res) != nil {
			return
		}
		out := []*anypb.Any{res}
		if err := NewConverter(c).Convert(ctx, out); err != nil {
			return
		}
		// Accepted: what goes to Envoy decodes and loads no remote code.
		ec, f, err := decode(out[0])
		if err != nil || f != nil {
			t.Fatalf("Convert accepted %v, which is forwarded with remote code or undecodable (%v)", ec, err)
		}
	})
}

var rbacRules rbacv3.RBAC
