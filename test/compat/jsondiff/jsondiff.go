// Package jsondiff compares two JSON documents as data (decoded with encoding/json: objects
// as maps, numbers as float64) and lists where they differ, by path. Lists are compared
// element by element: their order matters (Envoy applies its stats tags in order).
package jsondiff

import (
	"fmt"
	"reflect"
	"sort"
)

// Diff lists the paths (under path) where got and want differ, sorted.
func Diff(path string, got, want any) []string {
	var out []string
	walk(path, got, want, &out)
	sort.Strings(out)
	return out
}

func walk(path string, got, want any, out *[]string) {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			*out = append(*out, fmt.Sprintf("%s: got %s, want an object", path, short(got)))
			return
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok {
				*out = append(*out, fmt.Sprintf("%s.%s: missing (want %s)", path, k, short(wv)))
				continue
			}
			walk(path+"."+k, gv, wv, out)
		}
		for k, gv := range g {
			if _, ok := w[k]; !ok {
				*out = append(*out, fmt.Sprintf("%s.%s: unexpected %s", path, k, short(gv)))
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok {
			*out = append(*out, fmt.Sprintf("%s: got %s, want a list", path, short(got)))
			return
		}
		for i := 0; i < len(w) || i < len(g); i++ {
			p := fmt.Sprintf("%s[%d]", path, i)
			switch {
			case i >= len(g):
				*out = append(*out, fmt.Sprintf("%s: missing (want %s)", p, short(w[i])))
			case i >= len(w):
				*out = append(*out, fmt.Sprintf("%s: unexpected %s", p, short(g[i])))
			default:
				walk(p, g[i], w[i], out)
			}
		}
	default:
		if !reflect.DeepEqual(got, want) {
			*out = append(*out, fmt.Sprintf("%s: got %s, want %s", path, short(got), short(want)))
		}
	}
}

// short is a value for a message, cut at 120 characters.
func short(v any) string {
	s := fmt.Sprintf("%#v", v)
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}
