package dnsproxy

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The journal keeps the UDP queries a dns-proxy holds in memory that outlives it: agentd's
// memfd for the child (component.Env.State). recvmmsg writes each datagram, its length and its
// sender straight into the journal, and a query leaves the journal once it is answered: the
// length is zeroed before the next read of its batch, a forwarded query's slot is freed after
// its reply is sent. After a kill -9 the next dns-proxy finds the queries the dead one read
// but had not answered (table hits of its last batch, queries waiting for an upstream) and
// answers them. An answer sent twice, when the kill fell between the reply and the journal's
// update, is harmless: a resolver takes the first and drops the other.
//
// The memory holds journalRegions regions; each process owns one (its pid in the region's
// header), so that the old and the new process of a swap never share one. A region whose
// owner is dead is taken over: its pending queries are answered, then it is free again.

const (
	journalMagic   = 0x316e726a64746e61 // "antdjrn1"
	journalRegions = 4
	// slowSlots is how many forwarded queries a region keeps; more in flight go unjournaled.
	slowSlots = 1024
	// slowSlotData is the largest forwarded query journaled; DNS queries are far smaller.
	slowSlotData = 512
	pageSize     = 4096
)

type journalHeader struct {
	magic                                 uint64
	regionSize                            uint64
	sockets, lanesPerSocket, batch, slots uint32
	_                                     [32]byte
}

type regionHeader struct {
	owner atomic.Int32
	_     [60]byte
}

// lane is the batch memory of one UDP reader, in the journal.
type lane struct {
	hdrs  [udpBatch]mmsghdr
	iovs  [udpBatch]unix.Iovec
	addrs [udpBatch]unix.RawSockaddrInet6
	bufs  [udpBatch][maxUDPQuery]byte
}

// slowSlot is a query on the general path (forwarded, most often) until its reply is sent.
type slowSlot struct {
	pending atomic.Uint32
	sock    uint32
	namelen uint32
	n       uint32
	addr    unix.RawSockaddrInet6
	_       [4]byte
	data    [slowSlotData]byte
}

// pendingQuery is a query a dead process left unanswered.
type pendingQuery struct {
	sock int
	pkt  []byte
	peer peer
}

// journal is this process's region of the journal memory.
type journal struct {
	mem   []byte
	lanes []*lane     // [socket*lanesPerSocket + reader]
	slots []*slowSlot // the forwarded queries' slots
	free  chan int    // indexes of free slots
	owner *regionHeader
}

func regionSize(sockets, lanesPerSocket int) int {
	n := int(unsafe.Sizeof(regionHeader{})) + sockets*lanesPerSocket*int(unsafe.Sizeof(lane{})) + slowSlots*int(unsafe.Sizeof(slowSlot{}))
	return (n + pageSize - 1) / pageSize * pageSize
}

// openJournal maps f as the journal of a server with sockets UDP sockets of lanesPerSocket
// readers each, takes over the regions of dead processes (their unanswered queries are
// returned) and claims a region. Memory of another layout (another build, other sockets) is
// started anew: its queries are lost, as they were before there was a journal.
func openJournal(f *os.File, sockets, lanesPerSocket int) (*journal, []pendingQuery, error) {
	rsize := regionSize(sockets, lanesPerSocket)
	size := pageSize + journalRegions*rsize
	want := journalHeader{magic: journalMagic, regionSize: uint64(rsize), sockets: uint32(sockets),
		lanesPerSocket: uint32(lanesPerSocket), batch: udpBatch, slots: slowSlots}
	st, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("dns journal: %w", err)
	}
	// A new memfd is all zeros, which is an empty journal: writing it anyway would make every
	// page of it resident (2.4 MB of dns-proxy's memory, for a journal of a few queries).
	fresh := st.Size() == 0
	if st.Size() < int64(size) {
		if err := f.Truncate(int64(size)); err != nil {
			return nil, nil, fmt.Errorf("size dns journal: %w", err)
		}
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("map dns journal: %w", err)
	}
	hdr := (*journalHeader)(unsafe.Pointer(&mem[0]))
	if *hdr != want {
		if !fresh {
			clear(mem) // another layout: nothing in it can be read as queries
		}
		*hdr = want
	}
	me := int32(os.Getpid())
	var pending []pendingQuery
	mine := -1
	for i := range journalRegions {
		r := region(mem, i, rsize)
		owner := r.owner.Load()
		if owner != 0 && owner != me && !processAlive(owner) && r.owner.CompareAndSwap(owner, me) {
			pending = append(pending, takeOver(mem[pageSize+i*rsize:pageSize+(i+1)*rsize], sockets, lanesPerSocket)...)
			r.owner.Store(0)
		}
	}
	for i := range journalRegions {
		if region(mem, i, rsize).owner.CompareAndSwap(0, me) {
			mine = i
			break
		}
	}
	if mine < 0 {
		unix.Munmap(mem)
		return nil, pending, errors.New("dns journal: every region is taken by a live process")
	}
	j := &journal{mem: mem, owner: region(mem, mine, rsize), free: make(chan int, slowSlots)}
	j.lanes, j.slots = layout(mem[pageSize+mine*rsize:pageSize+(mine+1)*rsize], sockets, lanesPerSocket)
	for i, s := range j.slots {
		if !fresh {
			s.pending.Store(0)
		}
		j.free <- i
	}
	if !fresh {
		for _, l := range j.lanes {
			for k := range l.hdrs {
				l.hdrs[k].n = 0
			}
		}
	}
	return j, pending, nil
}

func region(mem []byte, i, rsize int) *regionHeader {
	return (*regionHeader)(unsafe.Pointer(&mem[pageSize+i*rsize]))
}

// layout returns the lanes and slots of a region's memory.
func layout(r []byte, sockets, lanesPerSocket int) ([]*lane, []*slowSlot) {
	off := int(unsafe.Sizeof(regionHeader{}))
	lanes := make([]*lane, sockets*lanesPerSocket)
	for i := range lanes {
		lanes[i] = (*lane)(unsafe.Pointer(&r[off]))
		off += int(unsafe.Sizeof(lane{}))
	}
	slots := make([]*slowSlot, slowSlots)
	for i := range slots {
		slots[i] = (*slowSlot)(unsafe.Pointer(&r[off]))
		off += int(unsafe.Sizeof(slowSlot{}))
	}
	return lanes, slots
}

// takeOver returns the queries a dead process left in region r, copied, and clears them.
func takeOver(r []byte, sockets, lanesPerSocket int) []pendingQuery {
	lanes, slots := layout(r, sockets, lanesPerSocket)
	var out []pendingQuery
	for li, l := range lanes {
		for k := range l.hdrs {
			h := &l.hdrs[k]
			if h.n == 0 || h.n > maxUDPQuery || h.hdr.Flags&unix.MSG_TRUNC != 0 || h.hdr.Namelen > unix.SizeofSockaddrInet6 {
				continue
			}
			out = append(out, pendingQuery{sock: li / lanesPerSocket, pkt: append([]byte(nil), l.bufs[k][:h.n]...),
				peer: peer{addr: l.addrs[k], len: h.hdr.Namelen}})
			h.n = 0
		}
	}
	for _, s := range slots {
		if s.pending.Load() == 0 || s.n > slowSlotData || int(s.sock) >= sockets || s.namelen > unix.SizeofSockaddrInet6 {
			continue
		}
		out = append(out, pendingQuery{sock: int(s.sock), pkt: append([]byte(nil), s.data[:s.n]...),
			peer: peer{addr: s.addr, len: s.namelen}})
		s.pending.Store(0)
	}
	return out
}

// processAlive tells whether pid exists (a zombie does: agentd reaps a child before it
// starts the next).
func processAlive(pid int32) bool {
	err := unix.Kill(int(pid), 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// batch returns the datagrams of reader lane, in the journal.
func (j *journal) batch(lane int) *datagrams {
	l := j.lanes[lane]
	b := &datagrams{
		hdrs:  l.hdrs[:],
		iovs:  l.iovs[:],
		addrs: l.addrs[:],
		bufs:  make([][]byte, udpBatch),
	}
	for i := range udpBatch {
		b.bufs[i] = l.bufs[i][:]
	}
	b.link()
	return b
}

// hold journals a query going the general path and returns its slot and the copy of pkt the
// slot holds, or -1 and nil when no slot is free or pkt is too long.
func (j *journal) hold(sock int, pkt []byte, p *peer) (int, []byte) {
	if len(pkt) > slowSlotData {
		return -1, nil
	}
	select {
	case i := <-j.free:
		s := j.slots[i]
		s.sock, s.namelen, s.n, s.addr = uint32(sock), p.len, uint32(len(pkt)), p.addr
		copy(s.data[:], pkt)
		s.pending.Store(1)
		return i, s.data[:len(pkt)]
	default:
		return -1, nil
	}
}

// release ends the journaling of slot i: its reply is sent (or will never be).
func (j *journal) release(i int) {
	if i < 0 {
		return
	}
	j.slots[i].pending.Store(0)
	j.free <- i
}

// close gives the region up. Queries still in it are answered already, or lost with the
// process anyway.
func (j *journal) close() {
	j.owner.owner.Store(0)
	unix.Munmap(j.mem)
}
