package samplewasm

import (
	"context"
	"slices"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// TestModule checks the module in a real Wasm runtime (wazero, which validates it fully as
// it compiles) and runs the callbacks a proxy-wasm host calls: the exports, their signatures
// (proxy-wasm's ABI 0.2.1) and what they answer.
func TestModule(t *testing.T) {
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	compiled, err := r.CompileModule(ctx, Module())
	if err != nil {
		t.Fatalf("compiling the module: %v", err)
	}
	sig := func(params, results []api.ValueType) string { return typesOf(params) + "-> " + typesOf(results) }
	i32 := api.ValueTypeI32
	want := map[string]string{
		"proxy_abi_version_0_2_1":  sig(nil, nil),
		"proxy_on_memory_allocate": sig([]api.ValueType{i32}, []api.ValueType{i32}),
		"proxy_on_context_create":  sig([]api.ValueType{i32, i32}, nil),
		"proxy_on_vm_start":        sig([]api.ValueType{i32, i32}, []api.ValueType{i32}),
		"proxy_on_configure":       sig([]api.ValueType{i32, i32}, []api.ValueType{i32}),
	}
	got := map[string]string{}
	for name, f := range compiled.ExportedFunctions() {
		got[name] = sig(f.ParamTypes(), f.ResultTypes())
	}
	for name, s := range want {
		if got[name] != s {
			t.Errorf("export %s: signature %q, want %q", name, got[name], s)
		}
	}
	if len(got) != len(want) {
		t.Errorf("exported functions %v, want only %v", got, want)
	}
	if _, ok := compiled.ExportedMemories()["memory"]; !ok {
		t.Error("no memory exported")
	}

	m, err := r.InstantiateModule(ctx, compiled, wazero.NewModuleConfig())
	if err != nil {
		t.Fatalf("instantiating the module: %v", err)
	}
	call := func(name string, args ...uint64) []uint64 {
		t.Helper()
		res, err := m.ExportedFunction(name).Call(ctx, args...)
		if err != nil {
			t.Fatalf("%s%v: %v", name, args, err)
		}
		return res
	}
	for _, f := range []string{"proxy_on_vm_start", "proxy_on_configure"} {
		if res := call(f, 1, 0); !slices.Equal(res, []uint64{1}) {
			t.Errorf("%s = %v, want [1] (success)", f, res)
		}
	}
	call("proxy_on_context_create", 2, 1)
	a, b := call("proxy_on_memory_allocate", 100)[0], call("proxy_on_memory_allocate", 8)[0]
	if a != heapStart || b != heapStart+100 {
		t.Errorf("allocations at %d and %d, want %d and %d", a, b, heapStart, heapStart+100)
	}
	if !m.Memory().Write(uint32(a), make([]byte, 100)) {
		t.Error("the first allocation is outside the memory")
	}
}

func typesOf(ts []api.ValueType) string {
	s := ""
	for _, t := range ts {
		s += api.ValueTypeName(t) + " "
	}
	return s
}
