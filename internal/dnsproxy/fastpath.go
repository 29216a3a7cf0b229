package dnsproxy

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"

	"github.com/miekg/dns"
)

// fastScratch holds one UDP reader's buffers for the fast path, which answers the common
// query — one A or AAAA question for a name in the table, plain or with a version-0 OPT —
// straight from the wire, without unpacking it. Anything else returns ok=false and takes
// the general path, which gives the same answers.
type fastScratch struct {
	name []byte
}

const (
	optLen    = 11 // an OPT record without options
	maxWireQ  = 255
	classINET = 1
)

// reply appends the reply to pkt to dst.
func (f *fastScratch) reply(t *Table, pkt, dst []byte) (out []byte, ok bool) {
	qend, fam, size, hasOpt, ok := f.parse(pkt)
	if !ok {
		return nil, false
	}
	h := t.hosts[string(f.name)]
	var target []byte // the CNAME's target when the name is a search-expanded CNAME
	if h == nil {
		var ok bool
		if target, ok = cutSearch(f.name, t.search); !ok {
			return nil, false
		}
		if h = t.hosts[string(target)]; h == nil {
			return nil, false
		}
	}
	w := &h.wire[fam]
	cnameLen, count := 0, w.count
	if len(target) > 0 && w.count > 0 { // no address of the family: no answer, no CNAME
		cnameLen, count = 12+len(target)+1, w.count+1
	}
	extra := 0
	if hasOpt {
		extra = optLen
	}
	if !w.ok || qend+cnameLen+len(w.section)+extra > size {
		return nil, false
	}
	msg := len(dst) // where the message starts: compression pointers count from there
	out = append(dst, pkt[:qend]...)
	out[msg+2] = 0x84 | pkt[2]&0x01 // QR, AA, the query's RD
	out[msg+3] = pkt[3] & 0x10      // the query's CD; RA off and NOERROR, as miekg's SetReply
	binary.BigEndian.PutUint16(out[msg+6:], count)
	binary.BigEndian.PutUint16(out[msg+8:], 0)
	binary.BigEndian.PutUint16(out[msg+10:], uint16(extra/optLen))
	n, rrLen := int(w.n), int(w.rrLen)
	if cnameLen == 0 {
		out = append(out, w.section...)
	} else {
		// The CNAME, owned by the question (a pointer to it), then the target's address
		// records, owned by the CNAME's target (a pointer to it in the CNAME's data).
		rdlen := len(target) + 1
		out = append(out, 0xC0, 12, 0, byte(dns.TypeCNAME), 0, classINET, 0, 0, 0, ttl, byte(rdlen>>8), byte(rdlen))
		ptr := 0xC000 | uint16(len(out)-msg)
		out = appendWireName(out, target)
		start := len(out)
		out = append(out, w.section...)
		for i := range n {
			binary.BigEndian.PutUint16(out[start+i*rrLen:], ptr)
		}
	}
	shuffleRecords(out[len(out)-n*rrLen:], n, rrLen)
	if hasOpt {
		out = append(out, 0, byte(dns.TypeOPT>>8), byte(dns.TypeOPT), localUDPSize>>8, localUDPSize&0xff, 0, 0, 0, 0, 0, 0)
	}
	return out, true
}

// parse checks that pkt is a query the fast path answers and leaves its lower-cased name,
// with a trailing dot, in f.name. fam is 0 for A and 1 for AAAA; size is the largest reply
// the client takes.
func (f *fastScratch) parse(pkt []byte) (qend, fam, size int, hasOpt, ok bool) {
	if len(pkt) < 12+1+4 || pkt[2]&0xFA != 0 { // QR, opcode and TC must be zero
		return 0, 0, 0, false, false
	}
	qd, an, ns, ar := binary.BigEndian.Uint16(pkt[4:]), binary.BigEndian.Uint16(pkt[6:]), binary.BigEndian.Uint16(pkt[8:]), binary.BigEndian.Uint16(pkt[10:])
	if qd != 1 || an != 0 || ns != 0 || ar > 1 {
		return 0, 0, 0, false, false
	}
	name := f.name[:0]
	off := 12
	for {
		if off >= len(pkt) || off-12 >= maxWireQ {
			return 0, 0, 0, false, false
		}
		l := int(pkt[off])
		off++
		if l == 0 {
			break
		}
		if l > 63 || off+l > len(pkt) {
			return 0, 0, 0, false, false
		}
		for _, c := range pkt[off : off+l] {
			switch {
			case c >= 'A' && c <= 'Z':
				c += 'a' - 'A'
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', c == '*':
			default: // characters miekg escapes: leave them to the general path
				return 0, 0, 0, false, false
			}
			name = append(name, c)
		}
		name = append(name, '.')
		off += l
	}
	f.name = name
	if len(name) == 0 || off+4 > len(pkt) || binary.BigEndian.Uint16(pkt[off+2:]) != classINET {
		return 0, 0, 0, false, false
	}
	switch binary.BigEndian.Uint16(pkt[off:]) {
	case dns.TypeA:
		fam = 0
	case dns.TypeAAAA:
		fam = 1
	default:
		return 0, 0, 0, false, false
	}
	qend = off + 4
	size = dns.MinMsgSize
	if ar == 0 {
		return qend, fam, size, false, qend == len(pkt)
	}
	// One OPT record: root owner, version 0, the rest of the packet exactly.
	o := pkt[qend:]
	if len(o) < optLen || o[0] != 0 || binary.BigEndian.Uint16(o[1:]) != dns.TypeOPT || o[6] != 0 ||
		optLen+int(binary.BigEndian.Uint16(o[9:])) != len(o) {
		return 0, 0, 0, false, false
	}
	size = max(size, int(binary.BigEndian.Uint16(o[3:])))
	return qend, fam, size, true, true
}

// appendWireName appends name (with a trailing dot, labels checked by parse) in wire form.
func appendWireName(b, name []byte) []byte {
	for len(name) > 1 {
		i := bytes.IndexByte(name, '.')
		b = append(append(b, byte(i)), name[:i]...)
		name = name[i+1:]
	}
	return append(b, 0)
}

// shuffleRecords shuffles the n records of rrLen bytes each in b.
func shuffleRecords(b []byte, n, rrLen int) {
	if n < 2 {
		return
	}
	var tmp [12 + 16]byte
	for i := n - 1; i > 0; i-- {
		j := rand.IntN(i + 1)
		if i == j {
			continue
		}
		ri, rj := b[i*rrLen:(i+1)*rrLen], b[j*rrLen:(j+1)*rrLen]
		copy(tmp[:rrLen], ri)
		copy(ri, rj)
		copy(rj, tmp[:rrLen])
	}
}
