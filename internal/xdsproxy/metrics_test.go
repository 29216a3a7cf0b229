package xdsproxy

import (
	"os"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/encoding/protowire"
)

// TestRecvMax: istio_agent_pilot_xds_recv_max is the size of the largest request received
// from a client so far, as Istio's agent measures it on its downstream server: it grows with
// a larger request and stays with a smaller one.
func TestRecvMax(t *testing.T) {
	up := startFakeUpstream(t)
	tp := startProxy(t, Config{Upstream: Upstream{Address: up.addr}})
	if got := tp.gauge(t, "istio_agent_pilot_xds_recv_max"); got != 0 {
		t.Fatalf("istio_agent_pilot_xds_recv_max before any request = %v, want 0", got)
	}
	s := openRaw(t, tp.uri(), sotw)
	request := func(pad int) []byte { // a request with pad bytes of unknown field 999
		b := encodeRequest(t, sotw, ListenerType)
		return protowire.AppendBytes(protowire.AppendTag(b, 999, protowire.BytesType), []byte(strings.Repeat("x", pad)))
	}
	for _, tt := range []struct {
		pad  int
		want int // the largest request so far
	}{
		{100, len(request(100))},
		{5000, len(request(5000))},
		{10, len(request(5000))},
	} {
		s.send(t, request(tt.pad))
		up.nextRequest(t, ListenerType) // received, so counted
		if got := tp.gauge(t, "istio_agent_pilot_xds_recv_max"); got != float64(tt.want) {
			t.Errorf("after a request of %d bytes: istio_agent_pilot_xds_recv_max = %v, want %d", len(request(tt.pad)), got, tt.want)
		}
	}
	// As pilot-agent lists it (shared/reference/istio/cases/probes/metrics.txt): name, type,
	// labels.
	b, err := os.ReadFile("../../../shared/reference/istio/cases/probes/metrics.txt")
	if err != nil {
		t.Fatalf("the reference metric families: %v", err)
	}
	mfs, err := tp.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "istio_agent_pilot_xds_recv_max" {
			continue
		}
		line := mf.GetName() + " " + strings.ToLower(mf.GetType().String()) + " -"
		if len(mf.GetMetric()) != 1 || len(mf.GetMetric()[0].GetLabel()) != 0 || !strings.Contains(string(b), "\n"+line+"\n") {
			t.Errorf("metric family %q (%d series) is not pilot-agent's", line, len(mf.GetMetric()))
		}
	}
}

// gauge is the value of the gauge name (without labels), failing if it is not registered.
func (tp *testProxy) gauge(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := tp.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && mf.GetType() == dto.MetricType_GAUGE && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("gauge %s not registered", name)
	return 0
}
