package dnsproxy

import (
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"

	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// testNames is a proxy in namespace ns1 with Kubernetes' usual search list.
var testNames = Names{
	Namespace: "ns1",
	Domain:    ProxyDomain("ns1.svc.cluster.local", "ns1"),
	Search:    []string{"ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"},
}

func kube(short, ns string, ips ...string) *ndsv1.NameTable_NameInfo {
	return &ndsv1.NameTable_NameInfo{Ips: ips, Registry: "Kubernetes", Shortname: short, Namespace: ns}
}

func external(ips ...string) *ndsv1.NameTable_NameInfo {
	return &ndsv1.NameTable_NameInfo{Ips: ips, Registry: "External"}
}

func testNameTable() *ndsv1.NameTable {
	return &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
		"details.ns1.svc.cluster.local":  kube("details", "ns1", "10.0.0.1"),
		"reviews.ns2.svc.cluster.local":  kube("reviews", "ns2", "10.0.0.2", "fd00::2"),
		"ratings.ns1.svc.cluster.local":  {Ips: []string{"10.0.0.3"}, Registry: "Kubernetes", Shortname: "ratings", Namespace: "ns1", AltHosts: []string{"ratings.legacy"}},
		"v6only.ns1.svc.cluster.local":   kube("v6only", "ns1", "fd00::4"),
		"headless.ns1.svc.cluster.local": kube("headless", "ns1", "10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"),
		"other.ns1.svc.remote.local":     kube("other", "ns1", "10.0.0.5"),
		"www.Example.com":                external("192.0.2.10"),
		"*.wild.example.org":             external("192.0.2.20", "2001:db8::20"),
		"broken.example.com":             external("not-an-ip"),
		// A ServiceEntry host equal to a search-expanded name wins over the CNAME.
		"www.example.com.ns1.svc.cluster.local": external("192.0.2.30"),
	}}
}

// rrStrings renders records as "owner type data" with the TTL, sorted (answers are shuffled).
func rrStrings(rrs []dns.RR) []string {
	out := make([]string, 0, len(rrs))
	for _, rr := range rrs {
		out = append(out, strings.Join(strings.Fields(rr.String()), " "))
	}
	slices.Sort(out)
	return out
}

func TestTableLookup(t *testing.T) {
	tab := NewTable(testNameTable(), testNames)
	tests := []struct {
		name  string
		qtype uint16
		found bool
		want  []string
	}{
		{"details.ns1.svc.cluster.local.", dns.TypeA, true, []string{"details.ns1.svc.cluster.local. 30 IN A 10.0.0.1"}},
		{"details.ns1.", dns.TypeA, true, []string{"details.ns1. 30 IN A 10.0.0.1"}},
		{"details.ns1.svc.", dns.TypeA, true, []string{"details.ns1.svc. 30 IN A 10.0.0.1"}},
		{"details.", dns.TypeA, true, []string{"details. 30 IN A 10.0.0.1"}},
		// The search short-cut: a resolver's first try for "details.ns1" with ndots:5. Names
		// that already end with the first search domain get none (Istio's rule).
		{"details.ns1.svc.cluster.local.ns1.svc.cluster.local.", dns.TypeA, false, nil},
		{"details.ns1.ns1.svc.cluster.local.", dns.TypeA, true, []string{
			"details.ns1.ns1.svc.cluster.local. 30 IN CNAME details.ns1.",
			"details.ns1. 30 IN A 10.0.0.1",
		}},
		{"details.ns1.svc.cluster.local.", dns.TypeAAAA, true, []string{}}, // NODATA
		{"reviews.ns2.svc.cluster.local.", dns.TypeAAAA, true, []string{"reviews.ns2.svc.cluster.local. 30 IN AAAA fd00::2"}},
		{"reviews.ns2.", dns.TypeA, true, []string{"reviews.ns2. 30 IN A 10.0.0.2"}},
		{"reviews.", dns.TypeA, false, nil},                       // short names only in the proxy's namespace
		{"reviews.ns1.svc.cluster.local.", dns.TypeA, false, nil}, // ns2's service is not in ns1
		{"ratings.legacy.", dns.TypeA, true, []string{"ratings.legacy. 30 IN A 10.0.0.3"}},
		{"v6only.", dns.TypeA, true, []string{}},
		{"v6only.ns1.ns1.svc.cluster.local.", dns.TypeA, true, []string{}}, // NODATA drops the CNAME too, as Istio
		{"v6only.", dns.TypeAAAA, true, []string{"v6only. 30 IN AAAA fd00::4"}},
		{"other.ns1.svc.remote.local.", dns.TypeA, true, []string{"other.ns1.svc.remote.local. 30 IN A 10.0.0.5"}},
		{"other.ns1.", dns.TypeA, false, nil}, // another cluster domain: no variants
		{"www.example.com.", dns.TypeA, true, []string{"www.example.com. 30 IN A 192.0.2.10"}},
		{"www.example.com.ns1.svc.cluster.local.", dns.TypeA, true, []string{"www.example.com.ns1.svc.cluster.local. 30 IN A 192.0.2.30"}},
		{"www.example.com.", dns.TypeTXT, false, nil}, // other types go upstream
		{"broken.example.com.", dns.TypeA, false, nil},
		{"a.wild.example.org.", dns.TypeA, true, []string{"a.wild.example.org. 30 IN A 192.0.2.20"}},
		{"b.a.wild.example.org.", dns.TypeAAAA, true, []string{"b.a.wild.example.org. 30 IN AAAA 2001:db8::20"}},
		{"wild.example.org.", dns.TypeA, false, nil},
		{"x.wild.example.org.ns1.svc.cluster.local.", dns.TypeA, true, []string{
			"*.wild.example.org. 30 IN A 192.0.2.20",
			"x.wild.example.org.ns1.svc.cluster.local. 30 IN CNAME *.wild.example.org.",
		}},
		{"unknown.example.net.", dns.TypeA, false, nil},
	}
	for _, tt := range tests {
		got, found := tab.Lookup(tt.name, tt.qtype)
		if found != tt.found {
			t.Errorf("Lookup(%s, %s) found = %v, want %v", tt.name, dns.TypeToString[tt.qtype], found, tt.found)
			continue
		}
		slices.Sort(tt.want)
		if gotS := rrStrings(got); found && !slices.Equal(gotS, tt.want) {
			t.Errorf("Lookup(%s, %s) = %q, want %q", tt.name, dns.TypeToString[tt.qtype], gotS, tt.want)
		}
	}
}

func TestTableSkipsEntriesWithoutAddresses(t *testing.T) {
	tab := NewTable(testNameTable(), testNames)
	if got, want := tab.Entries(), len(testNameTable().Table)-1; got != want {
		t.Errorf("Entries() = %d, want %d", got, want)
	}
}

func TestProxyDomain(t *testing.T) {
	tests := []struct{ domain, ns, want string }{
		{"ns1.svc.cluster.local", "ns1", "svc.cluster.local"},
		{"svc.cluster.local", "ns1", "svc.cluster.local"},
		{"ns2.svc.cluster.local", "ns1", "ns2.svc.cluster.local"},
		{"", "ns1", ""},
	}
	for _, tt := range tests {
		if got := ProxyDomain(tt.domain, tt.ns); got != tt.want {
			t.Errorf("ProxyDomain(%q, %q) = %q, want %q", tt.domain, tt.ns, got, tt.want)
		}
	}
}
