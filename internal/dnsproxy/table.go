package dnsproxy

import (
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
// any other name carries its addresses. Every name's answers are prebuilt, in miekg form for
// the general path and in wire form for the fast path.
type host struct {
	cname  *dns.CNAME // owner is the name itself; nil for an address name
	target *host      // the CNAME's target
	a      []dns.RR
	aaaa   []dns.RR
	wire   [2]wireAnswer // [0] for A, [1] for AAAA
}

// wireAnswer is the answer section of a reply to an exact-name query, packed with the
// question at offset 12, so that it can follow a copy of the query's own header and
// question. The address records are its last n records of size rrLen each.
type wireAnswer struct {
	ok      bool // false: build this reply on the general path
	count   uint16
	section []byte
	n       int
	rrLen   int
}

// Len returns how many names the table answers for (variants and CNAMEs included).
func (t *Table) Len() int { return len(t.hosts) }

// Entries returns how many name table entries had an address.
func (t *Table) Entries() int { return t.entries }

// entry is one name table entry with its IPs parsed.
type entry struct {
	names      []string
	ipv4, ipv6 []netip.Addr
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
					t.hosts[name] = &host{a: addressRRs(name, e.ipv4), aaaa: addressRRs(name, e.ipv6)}
				}
			}
		}
	}
	t.addSearchCNAMEs(n.Search)
	for name, h := range t.hosts {
		h.wire[0] = packAnswer(name, dns.TypeA, h)
		h.wire[1] = packAnswer(name, dns.TypeAAAA, h)
	}
	return t
}

func newEntry(hostname string, ni *ndsv1.NameTable_NameInfo, n Names) (entry, bool) {
	var e entry
	for _, s := range ni.GetIps() {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if ip.Is4() || ip.Is4In6() {
			e.ipv4 = append(e.ipv4, ip.Unmap())
		} else {
			e.ipv6 = append(e.ipv6, ip)
		}
	}
	if len(e.ipv4) == 0 && len(e.ipv6) == 0 {
		return e, false
	}
	e.names = hostVariants(hostname, ni, n)
	return e, true
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
		cn := &dns.CNAME{Hdr: rrHeader(expanded, dns.TypeCNAME), Target: name}
		t.hosts[expanded] = &host{cname: cn, target: t.hosts[name]}
	}
}

// canonical returns name lower-cased with exactly one trailing dot.
func canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, ".")) + "."
}

func rrHeader(name string, rrtype uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: rrtype, Class: dns.ClassINET, Ttl: ttl}
}

func addressRRs(name string, ips []netip.Addr) []dns.RR {
	if len(ips) == 0 {
		return nil
	}
	rrs := make([]dns.RR, len(ips))
	for i, ip := range ips {
		if ip.Is4() {
			rrs[i] = &dns.A{Hdr: rrHeader(name, dns.TypeA), A: ip.AsSlice()}
		} else {
			rrs[i] = &dns.AAAA{Hdr: rrHeader(name, dns.TypeAAAA), AAAA: ip.AsSlice()}
		}
	}
	return rrs
}

// Lookup answers an A or AAAA question for name (lower-cased, fully qualified) with
// Istio's semantics. found is false when the name is not in the table or the type is not
// A or AAAA: the query goes upstream. A found name with no address of the asked family has
// no answers (NODATA). The records are shared: callers copy before changing them.
func (t *Table) Lookup(name string, qtype uint16) (answers []dns.RR, found bool) {
	h, wildcard := t.find(name)
	if h == nil || (qtype != dns.TypeA && qtype != dns.TypeAAAA) {
		return nil, false
	}
	if !wildcard {
		return h.answers(qtype), true
	}
	// A wildcard hit: the records' owner becomes the question, or for a CNAME hit the
	// CNAME's owner becomes the question and its target's records keep their owner.
	addrs := h.addresses(qtype)
	if len(addrs) == 0 {
		return nil, true
	}
	if h.cname != nil {
		cn := dns.Copy(h.cname)
		cn.Header().Name = name
		return append([]dns.RR{cn}, addrs...), true
	}
	out := make([]dns.RR, len(addrs))
	for i, rr := range addrs {
		out[i] = dns.Copy(rr)
		out[i].Header().Name = name
	}
	return out, true
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

// addresses returns the A or AAAA records the host resolves to, following its CNAME.
func (h *host) addresses(qtype uint16) []dns.RR {
	if h.target != nil {
		h = h.target
	}
	if qtype == dns.TypeAAAA {
		return h.aaaa
	}
	return h.a
}

// answers returns the answer section for an exact-name query: the CNAME (if any) and the
// addresses, or nothing when there is no address of that family.
func (h *host) answers(qtype uint16) []dns.RR {
	addrs := h.addresses(qtype)
	if len(addrs) == 0 || h.cname == nil {
		return addrs
	}
	return append([]dns.RR{h.cname}, addrs...)
}

// packAnswer prebuilds the wire answer section of the reply to (name, qtype).
func packAnswer(name string, qtype uint16, h *host) wireAnswer {
	answers := h.answers(qtype)
	m := &dns.Msg{Compress: true, Question: []dns.Question{{Name: name, Qtype: qtype, Qclass: dns.ClassINET}}}
	m.Answer = answers
	full, err := m.Pack()
	if err != nil {
		return wireAnswer{}
	}
	m.Answer = nil
	w := wireAnswer{ok: true, count: uint16(len(answers)), section: full[m.Len():]}
	w.n = len(h.addresses(qtype))
	if w.n == 0 {
		return w
	}
	// Each address record's owner compresses to a pointer: 2 + 10 + the address.
	w.rrLen = 12 + 4
	if qtype == dns.TypeAAAA {
		w.rrLen = 12 + 16
	}
	cnameLen := len(w.section) - w.n*w.rrLen
	if cnameLen < 0 || (h.cname == nil) != (cnameLen == 0) {
		return wireAnswer{}
	}
	return w
}
