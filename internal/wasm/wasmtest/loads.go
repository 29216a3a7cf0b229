package wasmtest

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httprbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// Loads says what an ECDS resource makes Envoy load, with the resource's name:
// "file:<path>", "allow" or "deny" (Istio's RBAC fallbacks of a module that could not be
// fetched), "remote" (which must never reach Envoy) or "other".
func Loads(t testing.TB, a *anypb.Any) (name, what string) {
	t.Helper()
	ec := &corev3.TypedExtensionConfig{}
	if err := a.UnmarshalTo(ec); err != nil {
		t.Fatal(err)
	}
	m, err := ec.GetTypedConfig().UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	switch m := m.(type) {
	case *httpwasm.Wasm:
		if code := m.GetConfig().GetVmConfig().GetCode(); code.GetLocal() != nil {
			return ec.GetName(), "file:" + code.GetLocal().GetFilename()
		}
		return ec.GetName(), "remote"
	case *httprbac.RBAC:
		switch {
		case m.GetRules() == nil && m.GetRulesStatPrefix() == "wasm-default-allow":
			return ec.GetName(), "allow"
		case m.GetRules() != nil && len(m.GetRules().GetPolicies()) == 0 && m.GetRulesStatPrefix() == "wasm-default-deny":
			return ec.GetName(), "deny"
		}
	}
	return ec.GetName(), "other"
}
