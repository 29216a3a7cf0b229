package status

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
)

// maxAppMetrics is the largest application metrics body merged; a larger one is dropped and
// counted as a failed scrape (Istio: 10 MiB per target).
const maxAppMetrics = 10 << 20

// componentLabel tells apart the series of a metric name that several processes export
// (each helper's Go runtime metrics, say); names exported by one process keep their labels, and
// so do series that already have a component label.
const componentLabel = "component"

// istioReservedPorts cannot be application metrics targets.
var istioReservedPorts = []int{15000, 15001, 15004, 15006, 15008, 15020, 15021, 15053, 15090}

// MetricsSource is one helper's metrics in the Prometheus text format.
type MetricsSource struct {
	Name  string
	Fetch func(ctx context.Context) ([]byte, error)
}

// AppMetrics is the application's metrics endpoints, scraped on localhost.
type AppMetrics struct {
	Targets []AppTarget
}

// AppTarget is one application metrics endpoint.
type AppTarget struct {
	Port string `json:"port"`
	Path string `json:"path"`
}

// ParsePrometheusAnnotations reads ISTIO_PROMETHEUS_ANNOTATIONS
// ({"scrape":"true","path":"/metrics","port":"8080","targets":[{"port":..,"path":..}]}) with
// Istio's defaults (path /metrics, port 80) and checks. It returns nil for an empty value or
// scrape "false".
func ParsePrometheusAnnotations(s string, statusPort int) (*AppMetrics, error) {
	if s == "" {
		return nil, nil
	}
	var c struct {
		Scrape  string      `json:"scrape"`
		Path    string      `json:"path"`
		Port    string      `json:"port"`
		Targets []AppTarget `json:"targets"`
	}
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return nil, fmt.Errorf("failed to unmarshal ISTIO_PROMETHEUS_ANNOTATIONS: %v", err)
	}
	if c.Scrape == "false" {
		return nil, nil
	}
	targets := c.Targets
	if len(targets) == 0 {
		targets = []AppTarget{{Port: c.Port, Path: c.Path}}
	}
	for i := range targets {
		t := &targets[i]
		if t.Path == "" {
			t.Path = "/metrics"
		}
		if !strings.HasPrefix(t.Path, "/") {
			t.Path = "/" + t.Path
		}
		if t.Port == "" {
			t.Port = "80"
		}
		if err := checkTargetPort(t.Port, statusPort); err != nil {
			return nil, err
		}
	}
	return &AppMetrics{Targets: targets}, nil
}

func checkTargetPort(port string, statusPort int) error {
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("invalid prometheus scrape configuration: port %q is not a number in 1-65535", port)
	}
	if p == statusPort {
		return fmt.Errorf("invalid prometheus scrape configuration: "+
			"application port is the same as agent port, which may lead to a recursive loop. "+
			"Ensure pod does not have prometheus.io/port=%d label, or that injection is not happening multiple times", statusPort)
	}
	if slices.Contains(istioReservedPorts, p) {
		return fmt.Errorf("invalid prometheus scrape configuration: port %d is reserved by Istio", p)
	}
	return nil
}

// scrapeMetrics are Istio's scrape counters.
type scrapeMetrics struct {
	total    prometheus.Counter
	failures *prometheus.CounterVec
}

func newScrapeMetrics(reg prometheus.Registerer) (*scrapeMetrics, error) {
	m := &scrapeMetrics{
		total: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_agent_scrapes_total", Help: "The total number of scrapes.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_agent_scrape_failures_total", Help: "The total number of failed scrapes.",
		}, []string{"type"}),
	}
	for _, c := range []prometheus.Collector{m.total, m.failures} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register scrape metrics: %w", err)
		}
	}
	return m, nil
}

// handleStats writes one exposition: agentd's and its helpers' metrics (text), then Envoy's
// as Envoy wrote them, then the application's, last because an OpenMetrics body ends with
// "# EOF". Failures are logged and counted, never returned: the page is always served.
func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) {
	if s.cfg.MetricsLocalhostOnly && !isLocal(r) {
		http.Error(w, "Only requests from localhost are allowed", http.StatusForbidden)
		return
	}
	s.metrics.total.Inc()
	ctx := r.Context()
	if v := r.Header.Get("X-Prometheus-Scrape-Timeout-Seconds"); v != "" {
		if secs, err := strconv.ParseFloat(v, 64); err == nil && secs > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Duration(secs*float64(time.Second)))
			defer cancel()
		} else {
			s.log.Warn("bad scrape timeout header", "value", v)
		}
	}

	var wg sync.WaitGroup
	var envoy io.ReadCloser
	if s.cfg.EnvoyMetricsURL != "" {
		wg.Go(func() {
			u := s.cfg.EnvoyMetricsURL
			if r.URL.RawQuery != "" {
				u += "?" + r.URL.RawQuery
			}
			var err error
			if envoy, _, err = s.scrape(ctx, u, r.Header, textAccept); err != nil {
				s.log.Error("failed scraping envoy metrics", "error", err)
				s.metrics.failures.WithLabelValues("envoy").Inc()
			}
		})
	}
	var app appBodies
	if s.cfg.App != nil {
		wg.Go(func() { app = s.scrapeApp(ctx, r.Header) })
	}
	var agent []*dto.MetricFamily
	wg.Go(func() { agent = s.agentFamilies(ctx) })
	wg.Wait()
	if envoy != nil {
		defer envoy.Close()
	}

	format := app.format()
	w.Header().Set("Content-Type", string(format))
	var out io.Writer = w
	if gz := gzipWriter(w, r); gz != nil {
		defer gz.Close()
		out = gz
	}
	enc := expfmt.NewEncoder(out, expfmt.FmtText)
	for _, mf := range agent {
		if err := enc.Encode(mf); err != nil {
			s.log.Error("failed writing agent metrics", "error", err)
			s.metrics.failures.WithLabelValues("agent").Inc()
			break
		}
	}
	if envoy != nil {
		if err := copyEndingInNewline(out, envoy); err != nil {
			s.log.Error("failed writing envoy metrics", "error", err)
			s.metrics.failures.WithLabelValues("envoy").Inc()
		}
	}
	if err := app.write(out, format); err != nil {
		s.log.Error("failed writing application metrics", "error", err)
		s.metrics.failures.WithLabelValues("application").Inc()
	}
}

// agentFamilies gathers agentd's registry and every helper's text, merged by name.
func (s *Server) agentFamilies(ctx context.Context) []*dto.MetricFamily {
	var m merger
	mfs, err := s.cfg.Registry.Gather()
	if err != nil {
		s.log.Error("failed gathering agent metrics", "error", err)
		s.metrics.failures.WithLabelValues("agent").Inc()
	}
	m.add("agentd", mfs)
	if s.cfg.Sources == nil {
		return m.families()
	}
	for _, src := range s.cfg.Sources(ctx) {
		text, err := src.Fetch(ctx)
		if err == nil {
			var fams map[string]*dto.MetricFamily
			p := expfmt.NewTextParser(model.UTF8Validation)
			if fams, err = p.TextToMetricFamilies(bytes.NewReader(text)); err == nil {
				m.add(src.Name, slices.Collect(mapValues(fams)))
				continue
			}
		}
		s.log.Error("failed scraping helper metrics", "helper", src.Name, "error", err)
		s.metrics.failures.WithLabelValues("agent").Inc()
	}
	fams := m.families()
	if len(m.conflicts) > 0 {
		s.log.Error("metric names that clash across processes, dropped", "names", m.conflicts)
	}
	return fams
}

func mapValues(m map[string]*dto.MetricFamily) func(func(*dto.MetricFamily) bool) {
	return func(yield func(*dto.MetricFamily) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// merger merges metric families from several processes into one valid exposition.
type merger struct {
	byName    map[string][]sourced
	conflicts []string
}

type sourced struct {
	source string
	mf     *dto.MetricFamily
}

func (m *merger) add(source string, mfs []*dto.MetricFamily) {
	if m.byName == nil {
		m.byName = map[string][]sourced{}
	}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 0 {
			continue
		}
		have := m.byName[mf.GetName()]
		if len(have) > 0 && have[0].mf.GetType() != mf.GetType() {
			m.conflicts = append(m.conflicts, source+":"+mf.GetName())
			continue
		}
		m.byName[mf.GetName()] = append(have, sourced{source, mf})
	}
}

// families returns the merged families sorted by name. A name exported by more than one
// source gets a component label on each series, so that no two series are the same. A name
// that is also one of a histogram's or summary's series names (h_bucket, h_sum, h_count) is
// dropped: the text format cannot tell them apart.
func (m *merger) families() []*dto.MetricFamily {
	taken := map[string]bool{}
	for name, list := range m.byName {
		switch list[0].mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			taken[name+"_bucket"], taken[name+"_sum"], taken[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			taken[name+"_sum"], taken[name+"_count"] = true, true
		}
	}
	out := make([]*dto.MetricFamily, 0, len(m.byName))
	for name, list := range m.byName {
		if taken[name] {
			m.conflicts = append(m.conflicts, list[0].source+":"+name)
			continue
		}
		if len(list) == 1 {
			out = append(out, list[0].mf)
			continue
		}
		merged := &dto.MetricFamily{Name: list[0].mf.Name, Help: list[0].mf.Help, Type: list[0].mf.Type}
		for _, s := range list {
			for _, metric := range s.mf.GetMetric() {
				if !slices.ContainsFunc(metric.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == componentLabel }) {
					metric = proto.CloneOf(metric)
					metric.Label = append(metric.Label, &dto.LabelPair{Name: proto.String(componentLabel), Value: proto.String(s.source)})
				}
				merged.Metric = append(merged.Metric, metric)
			}
		}
		out = append(out, merged)
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

// Accept filters: Envoy may only answer in the text format, the app in text or OpenMetrics.
var (
	textAccept = []string{"text/plain"}
	appAccept  = []string{"text/plain", expfmt.OpenMetricsType}
)

// scrape GETs u with the scraper's User-Agent, timeout header and (filtered) Accept.
func (s *Server) scrape(ctx context.Context, u string, in http.Header, accept []string) (io.ReadCloser, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, "", err
	}
	for _, h := range []string{"User-Agent", "X-Prometheus-Scrape-Timeout-Seconds"} {
		if v := in.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	if a := filterAccept(in.Get("Accept"), accept); a != "" {
		req.Header.Set("Accept", a)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("error scraping %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, "", fmt.Errorf("error scraping %s, status code: %v", u, resp.StatusCode)
	}
	return resp.Body, resp.Header.Get("Content-Type"), nil
}

// filterAccept keeps the media ranges of an Accept header whose type is allowed.
func filterAccept(accept string, allowed []string) string {
	var keep []string
	for part := range strings.SplitSeq(accept, ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err == nil && slices.Contains(allowed, mt) {
			keep = append(keep, strings.TrimSpace(part))
		}
	}
	return strings.Join(keep, ",")
}

// appBody is one application target's answer.
type appBody struct {
	body   []byte
	format expfmt.Format
}

type appBodies []appBody

// scrapeApp scrapes every target concurrently; failed and oversized ones are left out.
func (s *Server) scrapeApp(ctx context.Context, in http.Header) appBodies {
	targets := s.cfg.App.Targets
	out := make([]*appBody, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			b, err := s.scrapeTarget(ctx, "http://localhost:"+t.Port+t.Path, in)
			if err != nil {
				s.log.Error("failed scraping application metrics", "error", err)
				s.metrics.failures.WithLabelValues("application").Inc()
				return
			}
			out[i] = b
		})
	}
	wg.Wait()
	var bodies appBodies
	for _, b := range out {
		if b != nil {
			bodies = append(bodies, *b)
		}
	}
	return bodies
}

func (s *Server) scrapeTarget(ctx context.Context, u string, in http.Header) (*appBody, error) {
	rc, ctype, err := s.scrape(ctx, u, in, appAccept)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxAppMetrics+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", u, err)
	}
	if len(b) > maxAppMetrics {
		return nil, fmt.Errorf("%s answered more than %d bytes", u, maxAppMetrics)
	}
	return &appBody{body: b, format: negotiateFormat(ctype)}, nil
}

// negotiateFormat is the response format for an app's Content-Type.
func negotiateFormat(contentType string) expfmt.Format {
	mt, params, err := mime.ParseMediaType(contentType)
	if err == nil && mt == expfmt.OpenMetricsType {
		switch params["version"] {
		case expfmt.OpenMetricsVersion_1_0_0:
			return expfmt.FmtOpenMetrics_1_0_0
		case expfmt.OpenMetricsVersion_0_0_1, "":
			return expfmt.FmtOpenMetrics_0_0_1
		}
	}
	return expfmt.FmtText
}

// format is OpenMetrics when every app body is, in the first one's version, else text.
func (a appBodies) format() expfmt.Format {
	if len(a) == 0 {
		return expfmt.FmtText
	}
	for _, b := range a {
		if b.format.FormatType() != expfmt.TypeOpenMetrics {
			return expfmt.FmtText
		}
	}
	return a[0].format
}

// write writes the bodies without their "# EOF" lines, and one "# EOF" at the end in
// OpenMetrics.
func (a appBodies) write(w io.Writer, format expfmt.Format) error {
	for _, b := range a {
		if err := copyEndingInNewline(w, bytes.NewReader(stripEOF(b.body))); err != nil {
			return err
		}
	}
	if len(a) > 0 && format.FormatType() == expfmt.TypeOpenMetrics {
		_, err := io.WriteString(w, "# EOF\n")
		return err
	}
	return nil
}

// stripEOF removes OpenMetrics' "# EOF" line.
func stripEOF(b []byte) []byte {
	t := bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(t, '\n'); bytes.Equal(bytes.TrimSpace(t[i+1:]), []byte("# EOF")) {
		return t[:i+1]
	}
	return b
}

// copyEndingInNewline copies r to w and adds a newline if r did not end with one, so that
// the next part starts on its own line.
func copyEndingInNewline(w io.Writer, r io.Reader) error {
	var last [1]byte
	tw := &lastByteWriter{w: w, last: &last}
	n, err := io.Copy(tw, r)
	if err != nil {
		return err
	}
	if n > 0 && last[0] != '\n' {
		_, err = io.WriteString(w, "\n")
	}
	return err
}

type lastByteWriter struct {
	w    io.Writer
	last *[1]byte
}

func (l *lastByteWriter) Write(p []byte) (int, error) {
	if len(p) > 0 {
		l.last[0] = p[len(p)-1]
	}
	return l.w.Write(p)
}
