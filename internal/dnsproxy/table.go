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
	hosts map[string]*host
	// search is the first search domain ("ns.svc.cluster.local."; "" without one): a table
	// name with it appended is a CNAME to the name (Istio's short-cut for the search list's
	// first try). Those names are answered as they are asked, not stored: with Kubernetes'
	// search list they would double the table.
	search  string
	entries int // name table entries with at least one address
}

// host is one name the proxy answers for, with its entry's addresses (shared with the other
// names of the entry). The replies to exact-name A and AAAA queries are prebuilt in wire form
// for the fast path; the general path builds its records when asked, so that the table holds
// each address once.
type host struct {
	addrs *addrs
	wire  [2]wireAnswer // [0] for A, [1] for AAAA
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

// Len returns how many names the table holds (variants included; the search-expanded CNAMEs
// are answered as they are asked, not held).
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
// hides a real name (find).
func NewTable(nt *ndsv1.NameTable, n Names) *Table {
	keys := make([]string, 0, len(nt.GetTable()))
	for k := range nt.GetTable() {
		keys = append(keys, k)
	}
	slices.Sort(keys)

	t := &Table{hosts: make(map[string]*host, len(keys)*2)}
	if len(n.Search) > 0 && strings.Trim(n.Search[0], ".") != "" {
		t.search = canonical(n.Search[0])
	}
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
			if prev, ok := shared[key]; ok && bytes.Equal(prev, w.section) {
				w.section = prev
			} else if len(w.section) > 0 {
				w.section = slices.Clone(w.section) // not the whole packed message
				shared[key] = w.section
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
	h, cname := t.find(name)
	if h == nil || (qtype != dns.TypeA && qtype != dns.TypeAAAA) {
		return nil, false
	}
	return h.answers(name, cname, qtype), true
}

// find returns the host for name and, when name is a search-expanded CNAME, the CNAME's
// target: a name of the table, else a name of the table with the first search domain
// appended, else the closest wildcard "*.rest." of name's parents (or a wildcard with the
// search domain appended), a real name before a CNAME at each step.
func (t *Table) find(name string) (h *host, cname string) {
	if h := t.hosts[name]; h != nil {
		return h, ""
	}
	if target, ok := t.searchTarget(name); ok {
		return t.hosts[target], target
	}
	for i := 0; i < len(name); i++ {
		if name[i] != '.' || i+1 >= len(name) {
			continue
		}
		wildcard := "*" + name[i:]
		if h := t.hosts[wildcard]; h != nil {
			return h, ""
		}
		if target, ok := t.searchTarget(wildcard); ok {
			return t.hosts[target], target
		}
	}
	return nil, ""
}

// searchTarget returns the name that name is a search-expanded CNAME to: name less the first
// search domain, if that is a name of the table that does not already end with the domain.
func (t *Table) searchTarget(name string) (string, bool) {
	target, ok := cutSearch(name, t.search)
	if !ok || t.hosts[target] == nil {
		return "", false
	}
	return target, true
}

// cutSearch returns name without the search domain search, when name is a name with search
// appended that did not end with search already. It takes the fast path's bytes as well,
// without allocating.
func cutSearch[S ~string | ~[]byte](name S, search string) (S, bool) {
	n, k := len(name), len(search)
	if k == 0 || n <= k || name[n-k-1] != '.' || string(name[n-k:]) != search {
		return name[:0], false
	}
	target := name[:n-k]
	if m := len(target); m > k && target[m-k-1] == '.' && string(target[m-k:]) == search {
		return name[:0], false
	}
	return target, true
}

// addresses returns the A or AAAA addresses of the host.
func (h *host) addresses(qtype uint16) []netip.Addr {
	if qtype == dns.TypeAAAA {
		return h.addrs.ipv6
	}
	return h.addrs.ipv4
}

// answers returns the answer section for a query of name that found h (through the CNAME
// to cname, if not ""): the CNAME and the addresses, or nothing when there is no address of
// that family. The records' owner is name (a wildcard hit's owner is the question), the
// CNAME's target for the addresses behind a CNAME.
func (h *host) answers(name, cname string, qtype uint16) []dns.RR {
	addrs := h.addresses(qtype)
	if len(addrs) == 0 {
		return nil
	}
	owner := name
	var out []dns.RR
	if cname != "" {
		out = append(make([]dns.RR, 0, 1+len(addrs)), &dns.CNAME{Hdr: rrHeader(name, dns.TypeCNAME), Target: cname})
		owner = cname
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
	answers := h.answers(name, "", qtype)
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
	if len(w.section) != n*int(w.rrLen) {
		return wireAnswer{}
	}
	return w
}
