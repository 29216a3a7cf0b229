package dnsproxy

import (
	"bytes"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"

	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// ttl is the TTL of every local answer, Istio's: low so that clients soon see new IPs.
const ttl = 30

// Names says how a name table becomes the names dns-proxy answers for: Istio's variants of
// Kubernetes service hosts, and the search-domain CNAME short-cut.
type Names struct {
	// Namespace is the pod's namespace: short names resolve only for its services.
	Namespace string
	// Domain is the proxy's domain without the namespace label ("svc.cluster.local"). Only
	// Kubernetes hosts that end with it get variants.
	Domain string
	// Search is the resolver's search list; its first entry gives the CNAME short-cut.
	Search []string
}

// ProxyDomain returns Istio's proxy domain for a --domain value: the domain without a
// leading label equal to the namespace.
func ProxyDomain(domain, namespace string) string {
	first, rest, ok := strings.Cut(domain, ".")
	if ok && first == namespace {
		return rest
	}
	return domain
}

// Table is an immutable lookup structure built from a name table. Queries read it without
// locks; an update builds a new one and swaps it in.
type Table struct {
	hosts   map[string]*host
	entries int // name table entries with at least one address
}

// host is one name the proxy answers for. A search-expanded name is a CNAME to its target;
// any other name carries its addresses, shared with the other names of its entry. The
// replies to exact-name A and AAAA queries are prebuilt in wire form for the fast path; the
// general path builds its records when asked, so that the table holds each address once.
type host struct {
	cname  string        // the CNAME's target name; "" for an address name
	target *host         // the CNAME's target
	addrs  *addrs        // nil for a CNAME
	wire   [2]wireAnswer // [0] for A, [1] for AAAA
}

// addrs are the addresses of a name table entry.
type addrs struct{ ipv4, ipv6 []netip.Addr }

// wireAnswer is the answer section of a reply to an exact-name query, packed with the
// question at offset 12, so that it can follow a copy of the query's own header and
// question. The address records are its last n records of size rrLen each. Sections with
// the same bytes (the variants of one entry: their records' owner is a pointer to the
// question) share one slice.
type wireAnswer struct {
	section  []byte
	count, n uint16
	rrLen    uint8
	ok       bool // false: build this reply on the general path
}

// Len returns how many names the table answers for (variants and CNAMEs included).
func (t *Table) Len() int { return len(t.hosts) }

// Entries returns how many name table entries had an address.
func (t *Table) Entries() int { return t.entries }

// entry is one name table entry with its IPs parsed.
type entry struct {
	names []string
	addrs *addrs
}

// NewTable builds the lookup table of nt. Entries without a parseable IP are skipped, as
// Istio does. Where two entries offer the same name, a host name beats a generated variant,
// and otherwise the entry whose host name sorts first wins; a search-expanded CNAME never
// hides a real name.
func NewTable(nt *ndsv1.NameTable, n Names) *Table {
	keys := make([]string, 0, len(nt.GetTable()))
	for k := range nt.GetTable() {
		keys = append(keys, k)
	}
	slices.Sort(keys)

	t := &Table{hosts: make(map[string]*host, len(keys)*2)}
	var entries []entry
	for _, k := range keys {
		e, ok := newEntry(k, nt.Table[k], n)
		if !ok {
			continue
		}
		entries = append(entries, e)
		t.entries++
	}
	// Host names first, then their variants, so that a variant never replaces a host.
	for pass := range 2 {
		for _, e := range entries {
			names := e.names[:1]
			if pass == 1 {
				names = e.names[1:]
			}
			for _, name := range names {
				if _, taken := t.hosts[name]; !taken {
					t.hosts[name] = &host{addrs: e.addrs}
				}
			}
		}
	}
	t.addSearchCNAMEs(n.Search)
	// The address names of one entry have the same answer sections (their records' owner is a
	// pointer to the question): keep one copy per entry and family.
	type sectionKey struct {
		addrs *addrs
		fam   int
	}
	shared := map[sectionKey][]byte{}
	for name, h := range t.hosts {
		for fam, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
			w := packAnswer(name, qtype, h) // w.section is still a slice of the packed message
			key := sectionKey{h.addrs, fam}
			if prev, ok := shared[key]; ok && h.cname == "" && bytes.Equal(prev, w.section) {
				w.section = prev
			} else if len(w.section) > 0 {
				w.section = slices.Clone(w.section) // not the whole packed message
				if h.cname == "" {
					shared[key] = w.section
				}
			}
			h.wire[fam] = w
		}
	}
	return t
}

func newEntry(hostname string, ni *ndsv1.NameTable_NameInfo, n Names) (entry, bool) {
	a := &addrs{}
	for _, s := range ni.GetIps() {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if ip.Is4() || ip.Is4In6() {
			a.ipv4 = append(a.ipv4, ip.Unmap())
		} else {
			a.ipv6 = append(a.ipv6, ip)
		}
	}
	if len(a.ipv4) == 0 && len(a.ipv6) == 0 {
		return entry{}, false
	}
	return entry{names: hostVariants(hostname, ni, n), addrs: a}, true
}

// hostVariants returns the names Istio answers for an entry, the host name first: for a
// Kubernetes host in the proxy's domain also short.ns., short.ns.svc. (the domain's first
// label), short. in the proxy's own namespace, and the deprecated alt hosts.
func hostVariants(hostname string, ni *ndsv1.NameTable_NameInfo, n Names) []string {
	fqdn := canonical(hostname)
	names := []string{fqdn}
	if ni.GetRegistry() != "Kubernetes" || n.Domain == "" || !strings.HasSuffix(strings.TrimSuffix(fqdn, "."), strings.ToLower(n.Domain)) {
		return names
	}
	short, ns := ni.GetShortname(), ni.GetNamespace()
	firstLabel, _, _ := strings.Cut(n.Domain, ".")
	names = append(names, canonical(short+"."+ns), canonical(short+"."+ns+"."+firstLabel))
	if ns == n.Namespace {
		names = append(names, canonical(short))
	}
	for _, alt := range ni.GetAltHosts() { //nolint:staticcheck // deprecated in Istio, still honoured
		names = append(names, canonical(alt))
	}
	return names
}

// addSearchCNAMEs adds, for every name that does not already end with the first search
// domain, the name with that domain appended as a CNAME to the name, unless it is a name
// of its own.
func (t *Table) addSearchCNAMEs(search []string) {
	if len(search) == 0 || strings.Trim(search[0], ".") == "" {
		return
	}
	suffix := canonical(search[0])
	targets := make([]string, 0, len(t.hosts))
	for name := range t.hosts {
		targets = append(targets, name)
	}
	for _, name := range targets {
		if strings.HasSuffix(name, "."+suffix) {
			continue
		}
		expanded := name + suffix
		if _, taken := t.hosts[expanded]; taken {
			continue
		}
		t.hosts[expanded] = &host{cname: name, target: t.hosts[name]}
	}
}

// canonical returns name lower-cased with exactly one trailing dot.
func canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, ".")) + "."
}

func rrHeader(name string, rrtype uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: rrtype, Class: dns.ClassINET, Ttl: ttl}
}

// Lookup answers an A or AAAA question for name (lower-cased, fully qualified) with
// Istio's semantics. found is false when the name is not in the table or the type is not
// A or AAAA: the query goes upstream. A found name with no address of the asked family has
// no answers (NODATA). The records are new: the caller may change them.
func (t *Table) Lookup(name string, qtype uint16) (answers []dns.RR, found bool) {
	h, _ := t.find(name)
	if h == nil || (qtype != dns.TypeA && qtype != dns.TypeAAAA) {
		return nil, false
	}
	return h.answers(name, qtype), true
}

// find returns the host for name: an exact match, else the closest wildcard "*.rest." of
// name's parents.
func (t *Table) find(name string) (h *host, wildcard bool) {
	if h := t.hosts[name]; h != nil {
		return h, false
	}
	for i := 0; i < len(name); i++ {
		if name[i] != '.' || i+1 >= len(name) {
			continue
		}
		if h := t.hosts["*"+name[i:]]; h != nil {
			return h, true
		}
	}
	return nil, false
}

// addresses returns the A or AAAA addresses the host resolves to, following its CNAME.
func (h *host) addresses(qtype uint16) []netip.Addr {
	if h.target != nil {
		h = h.target
	}
	if qtype == dns.TypeAAAA {
		return h.addrs.ipv6
	}
	return h.addrs.ipv4
}

// answers returns the answer section for a query of name that found h: the CNAME (if any)
// and the addresses, or nothing when there is no address of that family. The records'
// owner is name (a wildcard hit's owner is the question), the CNAME's target for the
// addresses behind a CNAME.
func (h *host) answers(name string, qtype uint16) []dns.RR {
	addrs := h.addresses(qtype)
	if len(addrs) == 0 {
		return nil
	}
	owner := name
	var out []dns.RR
	if h.cname != "" {
		out = append(make([]dns.RR, 0, 1+len(addrs)), &dns.CNAME{Hdr: rrHeader(name, dns.TypeCNAME), Target: h.cname})
		owner = h.cname
	}
	for _, ip := range addrs {
		if ip.Is4() {
			out = append(out, &dns.A{Hdr: rrHeader(owner, dns.TypeA), A: ip.AsSlice()})
		} else {
			out = append(out, &dns.AAAA{Hdr: rrHeader(owner, dns.TypeAAAA), AAAA: ip.AsSlice()})
		}
	}
	return out
}

// packAnswer prebuilds the wire answer section of the reply to (name, qtype). The section is
// a slice of the whole packed message: the caller copies what it keeps.
func packAnswer(name string, qtype uint16, h *host) wireAnswer {
	answers := h.answers(name, qtype)
	m := &dns.Msg{Compress: true, Question: []dns.Question{{Name: name, Qtype: qtype, Qclass: dns.ClassINET}}}
	m.Answer = answers
	full, err := m.Pack()
	if err != nil {
		return wireAnswer{}
	}
	m.Answer = nil
	n := len(h.addresses(qtype))
	if n > math.MaxUint16-1 {
		return wireAnswer{}
	}
	w := wireAnswer{ok: true, count: uint16(len(answers)), n: uint16(n)}
	if len(answers) == 0 {
		return w
	}
	w.section = full[m.Len():]
	// Each address record's owner compresses to a pointer: 2 + 10 + the address.
	w.rrLen = 12 + 4
	if qtype == dns.TypeAAAA {
		w.rrLen = 12 + 16
	}
	cnameLen := len(w.section) - n*int(w.rrLen)
	if cnameLen < 0 || (h.cname == "") != (cnameLen == 0) {
		return wireAnswer{}
	}
	return w
}
