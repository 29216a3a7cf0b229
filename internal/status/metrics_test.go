package status

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// fakeTarget serves a fixed metrics body with a content type and records the last request.
type fakeTarget struct {
	mu   sync.Mutex
	last *http.Request
	port string
}

func serveMetrics(t *testing.T, contentType, body string) *fakeTarget {
	t.Helper()
	f := &fakeTarget{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.last = r.Clone(context.Background())
		f.mu.Unlock()
		w.Header().Set("Content-Type", contentType)
		io.WriteString(w, body)
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	f.port = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	return f
}

func (f *fakeTarget) request() *http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

const (
	textType = "text/plain; version=0.0.4; charset=utf-8"
	omType   = "application/openmetrics-text; version=1.0.0; charset=utf-8"

	envoyText = "# TYPE envoy_cluster_upstream_cx_total counter\nenvoy_cluster_upstream_cx_total{cluster_name=\"xds-grpc\"} 3\n" +
		"# TYPE envoy_server_live gauge\nenvoy_server_live 1" // no final newline
	appText = "# HELP app_requests_total Requests.\n# TYPE app_requests_total counter\napp_requests_total{code=\"200\"} 7\n"
	appOM   = "# HELP app_jobs Jobs.\n# TYPE app_jobs counter\napp_jobs_total 5\n# TYPE app_temp gauge\napp_temp 21.5\n# EOF\n"
	appOM2  = "# TYPE app_queue gauge\napp_queue 2\n# EOF\n"
)

// helperText is a helper's metrics, with a name agentd exports too.
const helperText = "# HELP istio_agent_dns_requests_total DNS requests.\n# TYPE istio_agent_dns_requests_total counter\n" +
	"istio_agent_dns_requests_total 11\n# HELP istio_agent_shared shared name.\n# TYPE istio_agent_shared gauge\nistio_agent_shared 2\n"

func agentRegistry(t *testing.T) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "istio_agent_shared", Help: "shared name."})
	g.Set(1)
	reg.MustRegister(g)
	return reg
}

// scrapeParsed GETs the metrics page and parses it with prometheus/common's decoder for the
// format the page says it is in.
func scrapeParsed(t *testing.T, url string, hdr http.Header) (map[string]*dto.MetricFamily, string, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header = hdr
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s = %d", url, resp.StatusCode)
	}
	var r io.Reader = resp.Body
	if hdr.Get("Accept-Encoding") == "gzip" {
		if resp.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("asked for gzip, got Content-Encoding %q", resp.Header.Get("Content-Encoding"))
		}
		if r, err = gzip.NewReader(resp.Body); err != nil {
			t.Fatal(err)
		}
	}
	body, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	dec := expfmt.NewDecoder(strings.NewReader(string(body)), expfmt.ResponseFormat(resp.Header))
	fams := map[string]*dto.MetricFamily{}
	for {
		mf := &dto.MetricFamily{}
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("merged page does not parse: %v\n%s", err, body)
		}
		fams[mf.GetName()] = mf
	}
	return fams, resp.Header.Get("Content-Type"), string(body)
}

func TestMetricsMerge(t *testing.T) {
	envoy := serveMetrics(t, textType, envoyText)
	appT := serveMetrics(t, textType, appText)
	appO := serveMetrics(t, omType, appOM)
	appO2 := serveMetrics(t, "application/openmetrics-text; version=0.0.1", appOM2)
	huge := serveMetrics(t, textType, "# TYPE big gauge\n"+strings.Repeat("big 1\n", (maxAppMetrics/6)+10))
	down := closedAddr(t)
	_, downPort, _ := net.SplitHostPort(down)

	sources := func(context.Context) []MetricsSource {
		return []MetricsSource{
			{Name: "dns-proxy", Fetch: func(context.Context) ([]byte, error) { return []byte(helperText), nil }},
			{Name: "sds-server", Fetch: func(context.Context) ([]byte, error) { return nil, errors.New("sds-server is backing-off") }},
			{Name: "garbled", Fetch: func(context.Context) ([]byte, error) { return []byte("not { metrics"), nil }},
		}
	}
	tests := []struct {
		name      string
		envoyURL  string
		app       *AppMetrics
		wantType  string
		wantFams  []string
		wantNot   []string
		failures  map[string]float64
		eofAtEnd  bool
		accept    string
		wantQuery string
	}{
		{
			name: "agent and envoy, no app", envoyURL: "http://127.0.0.1:" + envoy.port + "/stats/prometheus",
			wantType: textType, wantFams: []string{"istio_agent_dns_requests_total", "istio_agent_shared", "envoy_server_live", "envoy_cluster_upstream_cx_total", "istio_agent_scrapes_total"},
			failures: map[string]float64{"agent": 2}, accept: "application/vnd.google.protobuf;q=0.9,text/plain;version=0.0.4;q=0.5", wantQuery: "usedonly",
		},
		{
			name: "text app", app: &AppMetrics{Targets: []AppTarget{{Port: appT.port, Path: "/metrics"}}},
			wantType: textType, wantFams: []string{"app_requests_total", "istio_agent_shared"},
		},
		{
			name: "openmetrics app", envoyURL: "http://127.0.0.1:" + envoy.port + "/stats/prometheus",
			app:      &AppMetrics{Targets: []AppTarget{{Port: appO.port, Path: "/metrics"}}},
			wantType: omType, wantFams: []string{"app_jobs_total", "app_temp", "envoy_server_live", "istio_agent_shared"}, eofAtEnd: true,
		},
		{
			name: "two openmetrics targets, one EOF", app: &AppMetrics{Targets: []AppTarget{{Port: appO.port, Path: "/metrics"}, {Port: appO2.port, Path: "/m"}}},
			wantType: omType, wantFams: []string{"app_jobs_total", "app_queue"}, eofAtEnd: true,
		},
		{
			name: "mixed formats downgrade to text", app: &AppMetrics{Targets: []AppTarget{{Port: appO.port, Path: "/metrics"}, {Port: appT.port, Path: "/metrics"}}},
			wantType: textType, wantFams: []string{"app_jobs_total", "app_requests_total"},
		},
		{
			name: "app and envoy down, oversized target dropped", envoyURL: "http://" + down + "/stats/prometheus",
			app:      &AppMetrics{Targets: []AppTarget{{Port: downPort, Path: "/metrics"}, {Port: huge.port, Path: "/metrics"}, {Port: appT.port, Path: "/metrics"}}},
			wantType: textType, wantFams: []string{"app_requests_total", "istio_agent_shared"}, wantNot: []string{"big"},
			failures: map[string]float64{"envoy": 1, "application": 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := agentRegistry(t)
			_, base := start(t, Config{Registry: reg, Sources: sources, EnvoyMetricsURL: tc.envoyURL, App: tc.app}, "")
			hdr := http.Header{"User-Agent": {"Prometheus/3.0"}, "Accept-Encoding": {"gzip"}}
			if tc.accept != "" {
				hdr.Set("Accept", tc.accept)
			}
			url := base + "/stats/prometheus"
			if tc.wantQuery != "" {
				url += "?" + tc.wantQuery
			}
			fams, ctype, body := scrapeParsed(t, url, hdr)
			if ctype != tc.wantType {
				t.Errorf("Content-Type = %q, want %q", ctype, tc.wantType)
			}
			for _, name := range tc.wantFams {
				if fams[name] == nil {
					t.Errorf("merged page lacks %s:\n%s", name, body)
				}
			}
			for _, name := range tc.wantNot {
				if fams[name] != nil {
					t.Errorf("merged page has %s, want it dropped", name)
				}
			}
			if got := strings.Count(body, "# EOF"); (tc.eofAtEnd && (got != 1 || !strings.HasSuffix(body, "# EOF\n"))) || (!tc.eofAtEnd && got != 0) {
				t.Errorf("page has %d \"# EOF\" (at end: %v), want exactly one at the end: %v", got, strings.HasSuffix(body, "# EOF\n"), tc.eofAtEnd)
			}
			// A name exported by agentd and a helper is told apart by component.
			if shared := fams["istio_agent_shared"]; shared == nil || len(shared.GetMetric()) != 2 {
				t.Errorf("istio_agent_shared = %v, want one series per process", shared)
			}
			for typ, want := range tc.failures {
				if got := counter(t, reg, "istio_agent_scrape_failures_total", typ); got != want {
					t.Errorf("istio_agent_scrape_failures_total{type=%q} = %v, want %v", typ, got, want)
				}
			}
			if tc.wantQuery != "" {
				r := envoy.request()
				if r.URL.RawQuery != tc.wantQuery || r.Header.Get("User-Agent") != "Prometheus/3.0" || r.Header.Get("Accept") != "text/plain;version=0.0.4;q=0.5" {
					t.Errorf("envoy scraped with query %q UA %q Accept %q, want %q, Prometheus/3.0 and the text range only",
						r.URL.RawQuery, r.Header.Get("User-Agent"), r.Header.Get("Accept"), tc.wantQuery)
				}
			}
		})
	}
}

func counter(t *testing.T, g prometheus.Gatherer, name, typ string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "type" && l.GetValue() == typ {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestMetricsLocalhostOnly(t *testing.T) {
	s, base := start(t, Config{MetricsLocalhostOnly: true}, "0.0.0.0:0")
	if code, _, _ := do(t, "GET", base+"/metrics", nil); code != 200 {
		t.Errorf("local GET /metrics = %d, want 200", code)
	}
	ip := externalIP()
	if ip == "" {
		t.Skip("no non-loopback address")
	}
	if code, _, _ := do(t, "GET", fmt.Sprintf("http://%s/metrics", net.JoinHostPort(ip, strconv.Itoa(s.Port()))), nil); code != 403 {
		t.Errorf("remote GET /metrics = %d, want 403", code)
	}
}

func TestParsePrometheusAnnotations(t *testing.T) {
	tests := []struct {
		in      string
		want    []AppTarget
		wantErr string
	}{
		{"", nil, ""},
		{`{"scrape":"false","port":"8080"}`, nil, ""},
		{`{"scrape":"true"}`, []AppTarget{{"80", "/metrics"}}, ""},
		{`{"scrape":"true","path":"/m","port":"8080"}`, []AppTarget{{"8080", "/m"}}, ""},
		{`{"scrape":"true","targets":[{"port":"8080","path":"/a"},{"port":"9090"}]}`, []AppTarget{{"8080", "/a"}, {"9090", "/metrics"}}, ""},
		{`{"scrape":"true","port":"15020"}`, nil, "same as agent port"},
		{`{"scrape":"true","port":"15090"}`, nil, "reserved"},
		{`{"scrape":"true","port":"http"}`, nil, "not a number"},
		{`{"scrape":"true","port":"70000"}`, nil, "not a number"},
		{`{"scrape":`, nil, "failed to unmarshal ISTIO_PROMETHEUS_ANNOTATIONS"},
	}
	for _, tc := range tests {
		got, err := ParsePrometheusAnnotations(tc.in, 15020)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParsePrometheusAnnotations(%s) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParsePrometheusAnnotations(%s) = %v", tc.in, err)
			continue
		}
		var targets []AppTarget
		if got != nil {
			targets = got.Targets
		}
		if fmt.Sprint(targets) != fmt.Sprint(tc.want) {
			t.Errorf("ParsePrometheusAnnotations(%s) = %v, want %v", tc.in, targets, tc.want)
		}
	}
}
