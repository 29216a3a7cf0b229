package compat

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentd/agentd/internal/kubeprobe"
	"github.com/agentd/agentd/test/compat/probeapp"
)

// probeCase is one request of probe-cases.txt: ID METHOD PATH [OPTION...].
type probeCase struct {
	id, method, path string
	headers          [][2]string // H= and URLHOST=, in order
	flags            map[string]bool
}

func (c probeCase) has(flag string) bool { return c.flags[flag] }

// parseProbeCases reads probe-cases.txt.
func parseProbeCases(t *testing.T, path string) []probeCase {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []probeCase
	for n, line := range strings.Split(string(data), "\n") {
		if i := strings.Index(line, "#"); i >= 0 && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t') {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 3 {
			t.Fatalf("%s:%d: want ID METHOD PATH [OPTION...], got %q", path, n+1, line)
		}
		c := probeCase{id: f[0], method: f[1], path: f[2], flags: map[string]bool{}}
		for _, o := range f[3:] {
			switch {
			case strings.HasPrefix(o, "H="):
				name, value, ok := strings.Cut(strings.TrimPrefix(o, "H="), ":")
				if !ok {
					t.Fatalf("%s:%d: header option %q has no colon", path, n+1, o)
				}
				c.headers = append(c.headers, [2]string{name, value})
			case strings.HasPrefix(o, "URLHOST="):
				c.headers = append(c.headers, [2]string{"Host", strings.TrimPrefix(o, "URLHOST=")})
			case slices.Contains([]string{"NOKUBE", "GZ", "T", "PROM", "FAMILIES", "NOBODY", "CODEONLY", "QUIT", "EVSET"}, o):
				c.flags[o] = true
			default:
				t.Fatalf("%s:%d: unknown option %q", path, n+1, o)
			}
		}
		cases = append(cases, c)
	}
	return cases
}

// field is one KEY=VALUE of a probes.txt line (after the ID and the request).
type field struct{ key, value string }

// probeLine is a line of probes.txt: the case, the request, the fields.
type probeLine struct {
	id, request string
	fields      []field
}

func (l probeLine) String() string {
	parts := []string{l.id, l.request}
	for _, f := range l.fields {
		parts = append(parts, f.key+"="+f.value)
	}
	return strings.Join(parts, "\t")
}

func parseProbeLines(t *testing.T, path string) map[string]probeLine {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]probeLine{}
	for _, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		parts := strings.Split(line, "\t")
		if len(parts) < 3 {
			t.Fatalf("%s: line %q has no fields", path, line)
		}
		l := probeLine{id: parts[0], request: parts[1]}
		for _, p := range parts[2:] {
			k, v, ok := strings.Cut(p, "=")
			if !ok {
				t.Fatalf("%s: field %q of %s has no '='", path, p, l.id)
			}
			l.fields = append(l.fields, field{k, v})
		}
		lines[l.id] = l
	}
	return lines
}

// family is a metric family as metrics.txt lists it: name, type, label names.
type family struct{ name, typ, labels string }

func (f family) String() string { return f.name + " " + f.typ + " " + f.labels }

// parseFamilies reads the "## stats" list of metrics.txt.
func parseFamilies(t *testing.T, path string) map[string]family {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]family{}
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "## ") {
			in = line == "## stats"
			continue
		}
		f := strings.Fields(line)
		if !in || len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			t.Fatalf("%s: want NAME TYPE LABELS, got %q", path, line)
		}
		out[f[0]] = family{f[0], f[1], f[2]}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no families under ## stats", path)
	}
	return out
}

// familiesOf lists the families of a parsed Prometheus page: label names sorted and joined
// by commas ("-" for none; a histogram's le and a summary's quantile are not labels).
func familiesOf(mfs map[string]*dto.MetricFamily) map[string]family {
	out := map[string]family{}
	for name, mf := range mfs {
		labels := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		ls := strings.Join(slices.Sorted(maps.Keys(labels)), ",")
		if ls == "" {
			ls = "-"
		}
		out[name] = family{name, strings.ToLower(mf.GetType().String()), ls}
	}
	return out
}

// agentdOnlyFamilies are the families agentd serves and pilot-agent does not, on purpose
// (docs/compat.md, "App probes and the status port").
var agentdOnlyFamilies = map[string]string{
	"agentd_child_state":                       "agentd's supervisor: the state of each child process",
	"agentd_child_restarts_total":              "agentd's supervisor: restarts of each child process",
	"agentd_child_calls_missed_total":          "agentd's supervisor: calls to a child that did not answer",
	"agentd_output_certs_write_failures_total": "agentd's OUTPUT_CERTS writer",
	"agentd_app_probes_total":                  "agentd's prober: forwarded app probes by type and result",
}

// envoyOnlyFamilies are recorded families only a real Envoy serves (the stand-in cannot), and
// why. Empty: the stand-in serves every Envoy family of the recording.
var envoyOnlyFamilies = map[string]string{}

// counted says whether a family served by agentd counts in families=: not agentd's own ones,
// and of Envoy's (envoy_*, which the status port copies from Envoy as they are) only those
// of the recording: the rest are the stand-in's, which keeps more stats than the stand-in
// of the recording served.
func counted(name string, recorded map[string]family) bool {
	if _, own := agentdOnlyFamilies[name]; own {
		return false
	}
	_, ok := recorded[name]
	return ok || !strings.HasPrefix(name, "envoy_")
}

// probeDifferences are the fields in which agentd answers a case otherwise than pilot-agent,
// on purpose (docs/compat.md), by "ID KEY", and why.
var probeDifferences = map[string]string{}

// result is what one request to the status port gave.
type result struct {
	code      int
	ct, ce    string
	body      []byte
	rawLen    int // the body's length as sent (before gunzip)
	elapsed   time.Duration
	agentExit string // QUIT
	families  map[string]family
	parseErr  error
	events    []probeapp.Event
	sendErr   error
}

// send makes c's request to the status port as the recording did: a new connection, kubelet's
// headers unless NOKUBE, the options' headers.
func (c probeCase) send(ns *netns) result {
	start := time.Now()
	conn, err := ns.dial("127.0.0.1:15020", 5*time.Second)
	if err != nil {
		return result{sendErr: err}
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	headers := [][2]string{{"Host", "127.0.0.1:15020"}}
	if !c.has("NOKUBE") {
		headers = append(headers, [2]string{"User-Agent", "kube-probe/1.33"}, [2]string{"Accept", "*/*"}, [2]string{"Connection", "close"})
	}
	if c.has("GZ") {
		headers = append(headers, [2]string{"Accept-Encoding", "gzip"})
	}
	for _, h := range c.headers {
		headers = slices.DeleteFunc(headers, func(o [2]string) bool { return strings.EqualFold(o[0], h[0]) })
		headers = append(headers, h)
	}
	if c.method == http.MethodPost {
		headers = append(headers, [2]string{"Content-Length", "0"})
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\n", c.method, c.path)
	for _, h := range headers {
		fmt.Fprintf(&req, "%s: %s\r\n", h[0], h[1])
	}
	req.WriteString("\r\n")
	if _, err := conn.Write(req.Bytes()); err != nil {
		return result{sendErr: fmt.Errorf("write the request: %w", err)}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: c.method})
	if err != nil {
		return result{sendErr: fmt.Errorf("read the answer: %w", err)}
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return result{sendErr: fmt.Errorf("read the answer's body: %w", err)}
	}
	r := result{code: resp.StatusCode, ct: resp.Header.Get("Content-Type"), ce: resp.Header.Get("Content-Encoding"),
		body: raw, rawLen: len(raw), elapsed: time.Since(start)}
	if r.ce == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err == nil {
			r.body, err = io.ReadAll(zr)
		}
		if err != nil {
			r.sendErr = fmt.Errorf("gunzip the answer: %w", err)
		}
	}
	if c.has("PROM") {
		p := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
		r.parseErr = err
		r.families = familiesOf(mfs)
	}
	return r
}

var grpcGoVersion = regexp.MustCompile(`grpc-go/[^ "]+`)

// line formats r as probes.txt does.
func (c probeCase) line(r result, recorded map[string]family) probeLine {
	l := probeLine{id: c.id, request: c.method + " " + c.path}
	add := func(k, v string) { l.fields = append(l.fields, field{k, v}) }
	if r.sendErr != nil {
		add("error", r.sendErr.Error())
	}
	add("code", strconv.Itoa(r.code))
	if !c.has("CODEONLY") {
		add("ct", cmp.Or(r.ct, "-"))
		if r.ce != "" {
			size := "smaller"
			if r.rawLen >= len(r.body) {
				size = "not smaller"
			}
			add("ce", r.ce+"("+size+")")
		}
		switch {
		case c.has("PROM"):
			parse := "ok"
			if r.parseErr != nil {
				parse = "error: " + r.parseErr.Error()
			}
			add("parse", parse)
			n := 0
			for name := range r.families {
				if counted(name, recorded) {
					n++
				}
			}
			add("families", strconv.Itoa(n+len(envoyOnlyFamilies)))
		case c.has("NOBODY"):
			add("len", strconv.Itoa(len(r.body)))
		default:
			add("len", strconv.Itoa(len(r.body)))
			add("body", strconv.Quote(string(r.body)))
		}
	}
	if c.has("T") {
		add("t", fmt.Sprintf("%ds", int(r.elapsed/time.Second)))
	}
	if c.has("QUIT") {
		add("agent_exit", r.agentExit)
	}
	var evs []string
	for _, e := range r.events {
		s := grpcGoVersion.ReplaceAllString(e.String(), "grpc-go/<v>")
		switch {
		case c.has("EVSET"):
			if !slices.Contains(evs, s) {
				evs = append(evs, s)
			}
		case len(evs) > 0 && strings.TrimSuffix(evs[len(evs)-1], repeatSuffix(evs[len(evs)-1])) == s:
			last := evs[len(evs)-1]
			n := 1
			if suf := repeatSuffix(last); suf != "" {
				n, _ = strconv.Atoi(strings.TrimPrefix(suf, " x"))
			}
			evs[len(evs)-1] = s + " x" + strconv.Itoa(n+1)
		default:
			evs = append(evs, s)
		}
	}
	add("app", "["+strings.Join(evs, "; ")+"]")
	return l
}

var repeatRE = regexp.MustCompile(` x[0-9]+$`)

// repeatSuffix is the " xN" repeat count of an event, or "".
func repeatSuffix(s string) string { return repeatRE.FindString(s) }

// diffLines compares a line field by field: each difference as "key: got ..., want ...".
func diffLines(got, want probeLine) []string {
	var diffs []string
	if got.request != want.request {
		diffs = append(diffs, fmt.Sprintf("request: got %q, want %q", got.request, want.request))
	}
	gm, wm := map[string]string{}, map[string]string{}
	var gk, wk []string
	for _, f := range got.fields {
		gm[f.key] = f.value
		gk = append(gk, f.key)
	}
	for _, f := range want.fields {
		wm[f.key] = f.value
		wk = append(wk, f.key)
	}
	for _, k := range wk {
		g, ok := gm[k]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: missing, want %s", k, wm[k]))
		case g != wm[k]:
			diffs = append(diffs, fmt.Sprintf("%s: got %s, want %s", k, g, wm[k]))
		}
	}
	for _, k := range gk {
		if _, ok := wm[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: got %s, not recorded", k, gm[k]))
		}
	}
	if len(diffs) == 0 && !slices.Equal(gk, wk) {
		diffs = append(diffs, fmt.Sprintf("field order: got %v, want %v", gk, wk))
	}
	return diffs
}

// claim is what of the app's events a probe causes: the app's port, and for httpGet the
// request URI.
func claim(p *kubeprobe.KubeProbe) string {
	switch {
	case p.HTTPGet != nil:
		path := p.HTTPGet.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		return fmt.Sprintf("http :%d %s", p.HTTPGet.Port.Int, path)
	case p.TCPSocket != nil:
		return fmt.Sprintf("tcp :%d", p.TCPSocket.Port.Int)
	case p.GRPC != nil:
		return fmt.Sprintf("grpc :%d", p.GRPC.Port)
	}
	return ""
}

func eventClaim(e probeapp.Event) string {
	if e.Kind == "http" {
		return fmt.Sprintf("http :%d %s", e.Port, e.URI)
	}
	return fmt.Sprintf("%s :%d", e.Kind, e.Port)
}

// TestProbesAsPilotAgent replays the recorded `probes` case: agentd runs with its
// ISTIO_KUBE_APP_PROBERS (probers.json, compacted as the injector writes it), the probe app
// (test/compat/probeapp) listens on 127.0.0.1:18080-18091 in agentd's network namespace, each
// request of probe-cases.txt goes to :15020 as kubelet sends it, and each answer, with what
// the app saw, is compared field by field with pilot-agent's line of probes.txt; the metric
// families of /stats/prometheus with metrics.txt.
func TestProbesAsPilotAgent(t *testing.T) {
	ref := reference(t)
	caseDir := filepath.Join(ref, "cases", "probes")
	cases := parseProbeCases(t, filepath.Join(caseDir, "probe-cases.txt"))
	want := parseProbeLines(t, filepath.Join(caseDir, "probes.txt"))
	wantFamilies := parseFamilies(t, filepath.Join(caseDir, "metrics.txt"))
	probersJSON, err := os.ReadFile(filepath.Join(caseDir, "probers.json"))
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, probersJSON); err != nil {
		t.Fatalf("probers.json: %v", err)
	}
	probers, err := kubeprobe.ParseKubeProbes(compact.String())
	if err != nil {
		t.Fatalf("probers.json: %v", err)
	}
	if len(cases) != len(want) {
		t.Errorf("%d requests in probe-cases.txt, %d recorded lines in probes.txt", len(cases), len(want))
	}
	if last := cases[len(cases)-1]; !last.has("QUIT") || slices.ContainsFunc(cases[:len(cases)-1], func(c probeCase) bool { return c.has("QUIT") }) {
		t.Fatalf("probe-cases.txt: the one QUIT request must be the last")
	}

	started := time.Now()
	// The base environment and the case's config.env, which sets ISTIO_KUBE_APP_PROBERS.
	r := startAgent(t, caseDir, filepath.Join(ref, "envoy_bootstrap_tmpl.json"), runOptions{})
	ns, err := openNetns(r.cmd.Process.Pid, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ready := probeCase{id: "ready", method: http.MethodGet, path: "/healthz/ready", flags: map[string]bool{}}
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if res := ready.send(ns); res.sendErr == nil && res.code == http.StatusOK {
			break
		}
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("agentd exited (%v) before it was ready:\n%s", err, r.log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agentd not ready within 90 s:\n%s", r.log())
		}
	}
	t.Logf("agentd ready after %v", time.Since(started).Round(time.Millisecond))

	ctx, cancel := context.WithCancel(context.Background())
	appc, appErr := make(chan *probeapp.App, 1), make(chan error, 1)
	go func() { appErr <- probeapp.Run(ctx, ns.listen, func(a *probeapp.App) { appc <- a }) }()
	defer func() {
		cancel()
		if err := <-appErr; err != nil {
			t.Errorf("probe app: %v", err)
		}
	}()
	var app *probeapp.App
	select {
	case app = <-appc:
	case err := <-appErr:
		appErr <- nil
		t.Fatalf("probe app: %v", err)
	}

	results := map[string]result{}
	// The timed requests (seconds each) run together: what each caused in the app is told
	// apart by the app's port and the probe's path, and an event no probe of the group claims
	// fails the test. The other requests run one after the other, QUIT last.
	var timed, rest []probeCase
	claims := map[string]string{}
	for _, c := range cases {
		p := probers[strings.SplitN(c.path, "?", 2)[0]]
		if !c.has("T") || p == nil || claims[claim(p)] != "" {
			rest = append(rest, c)
			continue
		}
		claims[claim(p)] = c.id
		timed = append(timed, c)
	}
	app.Reset()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, c := range timed {
		wg.Go(func() {
			res := c.send(ns)
			mu.Lock()
			defer mu.Unlock()
			results[c.id] = res
		})
	}
	wg.Wait()
	for _, e := range app.Events() {
		id, ok := claims[eventClaim(e)]
		if !ok {
			t.Errorf("the timed requests (%d) caused an event no probe of theirs accounts for: %v", len(timed), e)
			continue
		}
		res := results[id]
		res.events = append(res.events, e)
		results[id] = res
	}
	for _, c := range rest {
		app.Reset()
		res := c.send(ns)
		if p := probers[strings.SplitN(c.path, "?", 2)[0]]; p != nil && p.TCPSocket != nil && res.code == http.StatusOK {
			// agentd connected: the app accepts the connection in its own time, maybe after
			// agentd has answered.
			for deadline := time.Now().Add(2 * time.Second); len(app.Events()) == 0 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
		}
		if c.has("QUIT") {
			quit := time.Now()
			select {
			case err := <-r.done:
				r.done <- err
				if d := time.Since(quit); d < time.Second {
					res.agentExit = "<1s"
				} else {
					res.agentExit = fmt.Sprintf("%ds", int(d/time.Second))
				}
			case <-time.After(10 * time.Second):
				res.agentExit = "none within 10s"
			}
		}
		res.events = app.Events()
		results[c.id] = res
	}

	matched := 0
	for _, c := range cases {
		got := c.line(results[c.id], wantFamilies)
		w, ok := want[c.id]
		if !ok {
			t.Errorf("%s: no recorded line", c.id)
			continue
		}
		var diffs []string
		for _, d := range diffLines(got, w) {
			key, _, _ := strings.Cut(d, ":")
			if why, ok := probeDifferences[c.id+" "+key]; ok {
				t.Logf("%s: known difference (%s): %s", c.id, why, d)
				continue
			}
			diffs = append(diffs, d)
		}
		if len(diffs) > 0 {
			t.Errorf("%s differs from pilot-agent:\n  %s\n   got: %s\n  want: %s", c.id, strings.Join(diffs, "\n  "), got, w)
			continue
		}
		matched++
	}
	t.Logf("%d of %d requests answered as pilot-agent answered them", matched, len(cases))

	// The metric families, where the recording lists them.
	for _, c := range cases {
		if !c.has("FAMILIES") {
			continue
		}
		got := results[c.id].families
		for _, name := range slices.Sorted(maps.Keys(wantFamilies)) {
			w := wantFamilies[name]
			g, ok := got[name]
			switch {
			case !ok && envoyOnlyFamilies[name] != "":
				t.Logf("%s: %s not served: %s", c.id, name, envoyOnlyFamilies[name])
			case !ok:
				t.Errorf("%s: pilot-agent's family %s is missing", c.id, w)
			case g != w:
				t.Errorf("%s: family got %s, want %s", c.id, g, w)
			}
		}
		standIn := 0
		for _, name := range slices.Sorted(maps.Keys(got)) {
			if _, ok := wantFamilies[name]; ok {
				continue
			}
			if why, ok := agentdOnlyFamilies[name]; ok {
				t.Logf("%s: agentd's own family %s (%s)", c.id, got[name], why)
				continue
			}
			if !counted(name, wantFamilies) {
				standIn++ // the stand-in's, through the status port
				continue
			}
			t.Errorf("%s: family %s is not pilot-agent's", c.id, got[name])
		}
		t.Logf("%s: %d of Envoy's families besides the recorded ones, the stand-in's (not compared)", c.id, standIn)
	}
	t.Logf("probes case: %v in all", time.Since(started).Round(time.Millisecond))
	if t.Failed() {
		t.Logf("agentd's log:\n%s", r.log())
	}
}
