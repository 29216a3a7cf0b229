package dnsproxy

import (
	"encoding/binary"

	"github.com/miekg/dns"
)

// Small readers of the DNS wire format, for relaying upstream replies without unpacking
// them.

// questionEnd returns the offset just past msg's question section, or -1 if malformed.
func questionEnd(msg []byte) int {
	if len(msg) < 12 {
		return -1
	}
	off := 12
	for range binary.BigEndian.Uint16(msg[4:]) {
		if off = skipName(msg, off); off < 0 || off+4 > len(msg) {
			return -1
		}
		off += 4
	}
	return off
}

// skipName returns the offset just past the name at off, or -1 if malformed.
func skipName(msg []byte, off int) int {
	for {
		if off >= len(msg) {
			return -1
		}
		l := int(msg[off])
		switch {
		case l == 0:
			return off + 1
		case l&0xC0 == 0xC0: // a pointer ends the name
			if off+2 > len(msg) {
				return -1
			}
			return off + 2
		case l&0xC0 != 0:
			return -1
		}
		off += 1 + l
	}
}

// trailingOPT returns the offset of msg's OPT record when it is the message's last record
// and in the additional section, as every server puts it; -1 otherwise or if malformed.
func trailingOPT(msg []byte) int {
	off := questionEnd(msg)
	if off < 0 {
		return -1
	}
	records := int(binary.BigEndian.Uint16(msg[6:])) + int(binary.BigEndian.Uint16(msg[8:])) + int(binary.BigEndian.Uint16(msg[10:]))
	last, lastType := -1, uint16(0)
	for range records {
		start := off
		if off = skipName(msg, off); off < 0 || off+10 > len(msg) {
			return -1
		}
		lastType = binary.BigEndian.Uint16(msg[off:])
		off += 10 + int(binary.BigEndian.Uint16(msg[off+8:]))
		last = start
	}
	if off != len(msg) || lastType != dns.TypeOPT || binary.BigEndian.Uint16(msg[10:]) == 0 {
		return -1
	}
	return last
}

// asciiEqualFold reports whether a and b are equal but for ASCII case, as DNS names compare.
func asciiEqualFold(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x >= 'A' && x <= 'Z' {
			x += 'a' - 'A'
		}
		if y >= 'A' && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
