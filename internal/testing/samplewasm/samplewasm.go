// Package samplewasm is the quickstart's Wasm plugin: the smallest proxy-wasm module (ABI
// 0.2.1) a proxy-wasm host such as Envoy can load. It does nothing: a started VM and a
// configured plugin report success, and every stream callback is left out, which the host
// takes as "continue". devplane serves it so that `make run` shows a real module going
// through agentd's Wasm fetch and cache.
//
// The module is encoded here from the WebAssembly binary format's rules (core spec, chapter
// 5) rather than checked in as an opaque blob; its text form is:
//
//	(module
//	  (memory (export "memory") 1)
//	  (global $heap (mut i32) (i32.const 1024))
//	  (func (export "proxy_abi_version_0_2_1"))
//	  ;; the host's allocator (proxy-wasm's "malloc"): a bump allocator that never frees
//	  (func (export "proxy_on_memory_allocate") (param i32) (result i32)
//	    global.get $heap
//	    global.get $heap  local.get 0  i32.add  global.set $heap)
//	  (func (export "proxy_on_context_create") (param i32 i32))
//	  (func (export "proxy_on_vm_start") (export "proxy_on_configure")
//	    (param i32 i32) (result i32)
//	    i32.const 1))
package samplewasm

import (
	"crypto/sha256"
	"encoding/hex"
)

// Value types, section ids and instructions of the binary format.
const (
	i32 = 0x7f

	typeSection     = 1
	functionSection = 3
	memorySection   = 5
	globalSection   = 6
	exportSection   = 7
	codeSection     = 10

	exportFunc   = 0x00
	exportMemory = 0x02

	opEnd       = 0x0b
	opLocalGet  = 0x20
	opGlobalGet = 0x23
	opGlobalSet = 0x24
	opI32Const  = 0x41
	opI32Add    = 0x6a
)

// function is one function of the module: its signature, body and export names.
type function struct {
	params, results []byte
	body            []byte // instructions, without the final end
	exports         []string
}

var functions = []function{
	{exports: []string{"proxy_abi_version_0_2_1"}},
	{params: []byte{i32}, results: []byte{i32}, exports: []string{"proxy_on_memory_allocate"},
		body: []byte{opGlobalGet, 0, opGlobalGet, 0, opLocalGet, 0, opI32Add, opGlobalSet, 0}},
	{params: []byte{i32, i32}, exports: []string{"proxy_on_context_create"}},
	{params: []byte{i32, i32}, results: []byte{i32}, exports: []string{"proxy_on_vm_start", "proxy_on_configure"},
		body: []byte{opI32Const, 1}},
}

// heapStart is where the allocator starts: the first KiB stays unused.
const heapStart = 1024

// Module returns the module's binary.
func Module() []byte {
	var types, funcs, exports, code [][]byte
	exports = append(exports, export("memory", exportMemory, 0))
	for i, f := range functions {
		types = append(types, append(append([]byte{0x60}, vec(f.params)...), vec(f.results)...))
		funcs = append(funcs, uleb(uint32(i))) // function i has type i
		for _, name := range f.exports {
			exports = append(exports, export(name, exportFunc, uint32(i)))
		}
		body := append(append([]byte{0}, f.body...), opEnd) // no locals
		code = append(code, append(uleb(uint32(len(body))), body...))
	}
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = append(m, section(typeSection, types)...)
	m = append(m, section(functionSection, funcs)...)
	m = append(m, section(memorySection, [][]byte{{0x00, 1}})...) // minimum 1 page, no maximum
	heap := append([]byte{i32, 1, opI32Const}, sleb(heapStart)...)
	m = append(m, section(globalSection, [][]byte{append(heap, opEnd)})...) // mutable
	m = append(m, section(exportSection, exports)...)
	return append(m, section(codeSection, code)...)
}

// SHA256 is the hex sha256 of Module(), what a WasmPlugin pins it with.
func SHA256() string {
	h := sha256.Sum256(Module())
	return hex.EncodeToString(h[:])
}

func export(name string, kind byte, index uint32) []byte {
	return append(append(vec([]byte(name)), kind), uleb(index)...)
}

// section is a section of id holding the vector of items.
func section(id byte, items [][]byte) []byte {
	content := uleb(uint32(len(items)))
	for _, it := range items {
		content = append(content, it...)
	}
	return append(append([]byte{id}, uleb(uint32(len(content)))...), content...)
}

// vec is a vector of bytes: its length, then the bytes.
func vec(b []byte) []byte { return append(uleb(uint32(len(b))), b...) }

// uleb is v in unsigned LEB128.
func uleb(v uint32) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// sleb is v in signed LEB128.
func sleb(v int32) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
