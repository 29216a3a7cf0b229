package bootstrap

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
)

// tagRule is one of the bootstrap's stats_config.stats_tags.
type tagRule struct {
	TagName string `json:"tag_name"`
	Regex   string `json:"regex"`
}

// tagExtractor replays Envoy's tag extraction (source/common/stats/tag_producer_impl.cc and
// tag_extractor_impl.cc): every rule is searched in the whole stat name; on a match with a
// sub-expression, the first is removed from the name and the second (else the first) is the
// tag's value. Rules whose regex begins with "^word\." or "^word(?=\.)" apply only to names
// whose first token is word, after the rules without such a prefix. Envoy's regexes are C++
// std::regex (ECMAScript, with POSIX classes and lookahead): replayed with regexp2, with
// [:digit:] written as 0-9.
type tagExtractor struct {
	rule   tagRule
	re     *regexp2.Regexp
	prefix string
}

func newTagExtractors(t *testing.T, rules []tagRule) []tagExtractor {
	t.Helper()
	var out []tagExtractor
	for _, r := range rules {
		re, err := regexp2.Compile(strings.ReplaceAll(r.Regex, "[:digit:]", "0-9"), regexp2.None)
		if err != nil {
			t.Fatalf("tag %s: regex %q: %v", r.TagName, r.Regex, err)
		}
		out = append(out, tagExtractor{rule: r, re: re, prefix: regexPrefix(r.Regex)})
	}
	// Envoy: the rules without a prefix first, then those of the name's first token, each
	// group in the configured order.
	sort.SliceStable(out, func(i, j int) bool { return out[i].prefix == "" && out[j].prefix != "" })
	return out
}

// regexPrefix is Envoy's extractRegexPrefix: the word after "^" when a dot follows it.
func regexPrefix(re string) string {
	if !strings.HasPrefix(re, "^") {
		return ""
	}
	for i := 1; i < len(re); i++ {
		c := re[i]
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		rest := re[i:]
		if i > 1 && (strings.HasPrefix(rest, `\.`) || strings.HasPrefix(rest, `(?=\.)`)) {
			return re[1:i]
		}
		return ""
	}
	return ""
}

// extract returns the tag-extracted name and the tags, as Envoy's produceTags.
func extract(t *testing.T, extractors []tagExtractor, name string) (string, map[string]string) {
	t.Helper()
	first, _, _ := strings.Cut(name, ".")
	tags := map[string]string{}
	remove := make([]bool, len(name))
	for _, e := range extractors {
		if e.prefix != "" && e.prefix != first {
			continue
		}
		m, err := e.re.FindStringMatch(name)
		if err != nil {
			t.Fatal(err)
		}
		if m == nil || len(m.Groups()) < 2 {
			continue
		}
		g := m.Groups()
		removed, value := g[1], g[1]
		if len(g) > 2 {
			value = g[2]
		}
		if len(removed.Captures) == 0 {
			continue
		}
		tags[e.rule.TagName] = value.String()
		for i := removed.Index; i < removed.Index+removed.Length; i++ {
			remove[i] = true
		}
	}
	var b strings.Builder
	for i := range len(name) {
		if !remove[i] {
			b.WriteByte(name[i])
		}
	}
	return b.String(), tags
}

// TestStatsTagsOnIstiodNames: Envoy's tag rules of the bootstrap, agentd's own and Istio's
// template rendered, give the names and tags Istio's give for stat names as istiod >= 1.23
// writes them (cluster and listener stat prefixes ending with ";").
func TestStatsTagsOnIstiodNames(t *testing.T) {
	c := goldenCases[0].config(t)
	own, err := Build(c)
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(istioReference(t), "envoy_bootstrap_tmpl.json"))
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := Render(c, text)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		stat, name string
		tags       map[string]string
	}{
		{"cluster.outbound|9080||reviews.default.svc.cluster.local;.upstream_rq_total", "cluster.upstream_rq_total",
			map[string]string{"cluster_name": "outbound|9080||reviews.default.svc.cluster.local"}},
		{"cluster.outbound|9080||reviews.default.svc.cluster.local;.upstream_rq_503", "cluster.upstream_rq",
			map[string]string{"cluster_name": "outbound|9080||reviews.default.svc.cluster.local", "response_code": "503"}},
		{"cluster.inbound|8080||;.upstream_cx_active", "cluster.upstream_cx_active",
			map[string]string{"cluster_name": "inbound|8080||"}},
		{"cluster.xds-grpc;.upstream_rq_2xx", "cluster.upstream_rq",
			map[string]string{"cluster_name": "xds-grpc", "response_code_class": "2xx"}},
		{"http.outbound_0.0.0.0_9080;.downstream_rq_total", "http.downstream_rq_total",
			map[string]string{"http_conn_manager_prefix": "outbound_0.0.0.0_9080"}},
		{"http.inbound_10.244.1.17_8080;.rbac.allowed", "http.rbac",
			map[string]string{"http_conn_manager_prefix": "inbound_10.244.1.17_8080", "authz_enforce_result": "allowed"}},
		{"http.inbound_[fd00::5]_8080;.downstream_rq_5xx", "http.downstream_rq",
			map[string]string{"http_conn_manager_prefix": "inbound_[fd00::5]_8080", "response_code_class": "5xx"}},
		// The bootstrap's own listeners' prefixes have no ";": no tag, as with Istio.
		{"http.agent.downstream_rq_total", "http.agent.downstream_rq_total", map[string]string{}},
		{"server.main_thread.watchdog_miss", "server.watchdog_miss", map[string]string{"thread_name": "main_thread"}},
		{"server.worker_1.watchdog_mega_miss", "server.watchdog_mega_miss", map[string]string{"thread_name": "worker_1"}},
		{"listener.0.0.0.0_15006.downstream_cx_total", "listener.downstream_cx_total", map[string]string{"listener_address": "0.0.0.0_15006"}},
		{"tcp.outbound|3306||mysql.db.svc.cluster.local.downstream_cx_total", "tcp.downstream_cx_total",
			map[string]string{"tcp_prefix": "outbound|3306||mysql.db.svc.cluster.local"}},
		{"server.uptime", "server.uptime", map[string]string{}},
	}
	for _, doc := range []struct {
		name string
		data []byte
	}{{"own", own}, {"template", rendered}} {
		js, err := AsJSON(doc.data)
		if err != nil {
			t.Fatal(err)
		}
		var b struct {
			StatsConfig struct {
				StatsTags []tagRule `json:"stats_tags"`
			} `json:"stats_config"`
		}
		if err := json.Unmarshal(js, &b); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range b.StatsConfig.StatsTags {
			names = append(names, r.TagName)
		}
		if i, j := slices.Index(names, "cluster_name"), slices.Index(names, "thread_name"); i != 0 || j < 0 {
			t.Errorf("%s: tag order %v: want cluster_name first and thread_name present", doc.name, names)
		}
		extractors := newTagExtractors(t, b.StatsConfig.StatsTags)
		for _, tt := range tests {
			name, tags := extract(t, extractors, tt.stat)
			if name != tt.name {
				t.Errorf("%s: %s: name %q, want %q", doc.name, tt.stat, name, tt.name)
			}
			for k, v := range tt.tags {
				if tags[k] != v {
					t.Errorf("%s: %s: tag %s=%q, want %q (all: %v)", doc.name, tt.stat, k, tags[k], v, tags)
				}
			}
			for k, v := range tags {
				if _, ok := tt.tags[k]; !ok {
					t.Errorf("%s: %s: unexpected tag %s=%q", doc.name, tt.stat, k, v)
				}
			}
		}
	}
}
