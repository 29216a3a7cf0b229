package main

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// stats are Envoy's counters and gauges by their dotted names.
type stats struct {
	mu sync.Mutex
	m  map[string]uint64
}

func newStats() *stats { return &stats{m: map[string]uint64{}} }

func (s *stats) set(name string, v uint64) {
	s.mu.Lock()
	s.m[name] = v
	s.mu.Unlock()
}

func (s *stats) add(name string, d int64) {
	s.mu.Lock()
	s.m[name] = uint64(int64(s.m[name]) + d)
	s.mu.Unlock()
}

func (s *stats) get(name string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[name]
}

// writeText writes "name: value" lines, sorted, of the stats matching filter (all when nil).
func (s *stats) writeText(w io.Writer, filter *regexp.Regexp) {
	s.mu.Lock()
	names := make([]string, 0, len(s.m))
	for n := range s.m {
		if filter == nil || filter.MatchString(n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	lines := make([]string, len(names))
	for i, n := range names {
		lines[i] = fmt.Sprintf("%s: %d\n", n, s.m[n])
	}
	s.mu.Unlock()
	for _, l := range lines {
		io.WriteString(w, l)
	}
}

// writePrometheus writes the stats in the Prometheus text format, as Envoy names them.
func (s *stats) writePrometheus(w io.Writer) {
	s.mu.Lock()
	names := make([]string, 0, len(s.m))
	for n := range s.m {
		names = append(names, n)
	}
	sort.Strings(names)
	values := make([]uint64, len(names))
	for i, n := range names {
		values[i] = s.m[n]
	}
	s.mu.Unlock()
	r := strings.NewReplacer(".", "_", "-", "_", "[", "_", "]", "_", ":", "_")
	for i, n := range names {
		metric := "envoy_" + r.Replace(n)
		fmt.Fprintf(w, "# TYPE %s gauge\n%s{} %d\n", metric, metric, values[i])
	}
}
