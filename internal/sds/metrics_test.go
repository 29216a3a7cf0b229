package sds

import (
	"os"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// TestXDSMetrics: Istio's agent counts istio_agent_pilot_xds_expired_nonce{type="sds"} and
// istio_agent_pilot_xds_send_time in its SDS server; sds-server counts them the same way:
// a stale nonce on a request naming resources, not an empty nonce (a new subscription); one
// send time per response, in Istio's buckets.
func TestXDSMetrics(t *testing.T) {
	f := newXDSFixture(t)
	c := openSotW(t, f.conn)
	c.send([]string{f.a}, "", "", nil)
	r1 := nextResponse(t, c.resps)
	c.send([]string{f.a, f.b}, "", "stale", nil) // expired
	c.send([]string{f.a, f.b}, "", "", nil)      // no nonce: not counted
	c.send(nil, "", "stale", nil)                // no names: not counted
	c.send([]string{f.a, f.b}, r1.GetVersionInfo(), r1.GetNonce(), nil)
	nextResponse(t, c.resps) // the requests before were handled before this one

	// A send is timed once it returns, which may be after the client has the response.
	eventually(t, "two timed sends", func() bool {
		h := gather(t, f.s)["istio_agent_pilot_xds_send_time"].GetMetric()
		return len(h) == 1 && h[0].GetHistogram().GetSampleCount() >= 2
	})
	families := gather(t, f.s)
	expired := families["istio_agent_pilot_xds_expired_nonce"]
	if expired.GetType() != dto.MetricType_COUNTER || len(expired.GetMetric()) != 1 {
		t.Fatalf("istio_agent_pilot_xds_expired_nonce = %v, want one counter series", expired)
	}
	m := expired.GetMetric()[0]
	if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "type" || l[0].GetValue() != "sds" {
		t.Errorf("expired nonce labels = %v, want type=sds", l)
	}
	if got := m.GetCounter().GetValue(); got != 1 {
		t.Errorf("expired nonces = %v, want 1", got)
	}

	send := families["istio_agent_pilot_xds_send_time"]
	if send.GetType() != dto.MetricType_HISTOGRAM || len(send.GetMetric()) != 1 {
		t.Fatalf("istio_agent_pilot_xds_send_time = %v, want one histogram", send)
	}
	h := send.GetMetric()[0].GetHistogram()
	if h.GetSampleCount() != 2 {
		t.Errorf("send time samples = %d, want 2 (one per response)", h.GetSampleCount())
	}
	var bounds []float64
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	if want := []float64{.01, .1, 1, 3, 5, 10, 20, 30}; !slices.Equal(bounds, want) {
		t.Errorf("send time buckets = %v, want Istio's %v", bounds, want)
	}
	for _, name := range []string{"istio_agent_pilot_xds_expired_nonce", "istio_agent_pilot_xds_send_time"} {
		if got, want := familyLine(families[name]), referenceFamily(t, name); got != want {
			t.Errorf("metric family %q, pilot-agent's %q", got, want)
		}
	}
}

// familyLine is a metric family as the reference's metrics.txt lists it: name, type
// (lower case) and label names ("-" for none).
func familyLine(mf *dto.MetricFamily) string {
	labels := "-"
	if ms := mf.GetMetric(); len(ms) > 0 && len(ms[0].GetLabel()) > 0 {
		var names []string
		for _, l := range ms[0].GetLabel() {
			names = append(names, l.GetName())
		}
		labels = strings.Join(names, ",")
	}
	return mf.GetName() + " " + strings.ToLower(mf.GetType().String()) + " " + labels
}

// referenceFamily is name's line in the metric families recorded from pilot-agent.
func referenceFamily(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../../shared/reference/istio/cases/probes/metrics.txt")
	if err != nil {
		t.Fatalf("the reference metric families: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+" ") {
			return line
		}
	}
	t.Fatalf("pilot-agent has no metric %s", name)
	return ""
}

func gather(t *testing.T, s *sdsUnderTest) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}
