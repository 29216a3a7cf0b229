package compat

import (
	"slices"
	"testing"
	"time"

	"github.com/agentd/agentd/test/compat/probeapp"
)

// TestProbeLineFormat: answers are written as probes.txt writes them (repeats counted, or
// left out with EVSET; t= in whole seconds), and a line that differs in one field gives that
// field's difference only.
func TestProbeLineFormat(t *testing.T) {
	loop := probeapp.Event{Kind: "http", Peer: "127.0.0.6", Port: 18080, Proto: "HTTP/1.1", Method: "GET", URI: "/loop", UA: "kube-probe/1.33"}
	grpc := probeapp.Event{Kind: "grpc", Peer: "127.0.0.6", Service: "ready", UA: "kube-probe/1.33 grpc-go/1.85.0"}
	for _, tt := range []struct {
		name  string
		flags []string
		r     result
		want  string
	}{
		{"repeats", nil, result{code: 500, events: []probeapp.Event{loop, loop, loop, grpc}},
			`x	GET /p	code=500	ct=-	len=0	body=""	app=[http 127.0.0.6 :18080 HTTP/1.1 GET /loop ua="kube-probe/1.33" x3; grpc 127.0.0.6 service="ready" ua="kube-probe/1.33 grpc-go/<v>"]`},
		{"evset", []string{"EVSET", "T"}, result{code: 500, elapsed: 1999 * time.Millisecond, events: []probeapp.Event{loop, loop}},
			`x	GET /p	code=500	ct=-	len=0	body=""	t=1s	app=[http 127.0.0.6 :18080 HTTP/1.1 GET /loop ua="kube-probe/1.33"]`},
		{"gzip", []string{"NOBODY"}, result{code: 200, ct: "text/plain", ce: "gzip", body: make([]byte, 100), rawLen: 30},
			`x	GET /p	code=200	ct=text/plain	ce=gzip(smaller)	len=100	app=[]`},
		{"codeonly", []string{"CODEONLY"}, result{code: 200, ct: "text/html", body: []byte("x")}, `x	GET /p	code=200	app=[]`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := probeCase{id: "x", method: "GET", path: "/p", flags: map[string]bool{}}
			for _, f := range tt.flags {
				c.flags[f] = true
			}
			if got := c.line(tt.r, nil).String(); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
	got := probeLine{id: "x", request: "GET /p", fields: []field{{"code", "200"}, {"ct", "-"}, {"app", "[]"}}}
	want := probeLine{id: "x", request: "GET /p", fields: []field{{"code", "500"}, {"ct", "-"}, {"len", "0"}, {"app", "[]"}}}
	if d := diffLines(got, want); !slices.Equal(d, []string{"code: got 200, want 500", "len: missing, want 0"}) {
		t.Errorf("diffLines = %q", d)
	}
	if d := diffLines(want, want); d != nil {
		t.Errorf("diffLines of equal lines = %q", d)
	}
}
