package status

import (
	"bytes"
	"slices"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// FuzzMergedFamilies: whatever two helpers export, as long as each parses, the merged agent
// part of the metrics page parses too.
func FuzzMergedFamilies(f *testing.F) {
	f.Add(helperText, "# TYPE istio_agent_shared gauge\nistio_agent_shared{a=\"b\"} 3\n")
	f.Add("# TYPE x counter\nx 1\n", "# TYPE x gauge\nx 2\n")
	f.Add("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n", "h_bucket 4\n")
	f.Add("x{component=\"a\"} 1\n", "x{component=\"b\"} 2\n")
	f.Add("# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 1\ns_count 1\n", "s_count{component=\"x\"} 1\n")
	f.Fuzz(func(t *testing.T, a, b string) {
		var m merger
		for i, text := range []string{a, b} {
			p := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := p.TextToMetricFamilies(bytes.NewReader([]byte(text)))
			if err != nil {
				return
			}
			m.add([]string{"a", "b"}[i], slices.Collect(mapValues(fams)))
		}
		var out bytes.Buffer
		enc := expfmt.NewEncoder(&out, expfmt.FmtText)
		for _, mf := range m.families() {
			if err := enc.Encode(mf); err != nil {
				return // the encoder refuses it: the handler stops there and counts a failure
			}
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		if _, err := p.TextToMetricFamilies(&out); err != nil {
			t.Fatalf("merged page does not parse: %v\n%s", err, out.String())
		}
	})
}
