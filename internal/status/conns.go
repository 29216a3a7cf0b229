package status

import (
	"cmp"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// Timeouts of the status port's connections. kubelet and Prometheus send small requests and
// read small answers; a client slower than this holds agentd's memory and file descriptors
// for nothing.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second // a merged scrape waits on Envoy and the application
	idleTimeout       = 30 * time.Second
)

// DefaultMaxConns is the cap on the status port's open connections for a file descriptor
// limit: a quarter of it, between 16 and 512. The other three quarters stay for the control
// socket, the helpers' connections and their restarts, whatever the status port receives.
func DefaultMaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 512
	}
	return int(min(max(lim.Cur/4, 16), 512))
}

// connLimit keeps the status port's open connections at most max. A connection over the cap
// closes the one that has waited longest without a request in progress (new or idle between
// requests), so that a flood of idle connections never keeps kubelet's probes out; when every
// connection is in the middle of a request (each bounded by the read and write timeouts), the
// new one is closed instead.
type connLimit struct {
	max int // 0: DefaultMaxConns() at each new connection, following the limit as it changes

	mu      sync.Mutex
	open    int
	waiting map[net.Conn]time.Time // new or idle connections, since when
	closed  int                    // connections closed to stay under the cap
}

func newConnLimit(max int) *connLimit {
	return &connLimit{max: max, waiting: map[net.Conn]time.Time{}}
}

// track is the http.Server's ConnState hook.
func (l *connLimit) track(c net.Conn, st http.ConnState) {
	var victim net.Conn
	l.mu.Lock()
	switch st {
	case http.StateNew:
		l.open++
		l.waiting[c] = time.Now()
		if max := cmp.Or(l.max, DefaultMaxConns()); l.open > max {
			victim = l.oldestWaiting(c)
			l.closed++
		}
	case http.StateActive:
		delete(l.waiting, c)
	case http.StateIdle:
		l.waiting[c] = time.Now()
	case http.StateHijacked, http.StateClosed:
		l.open--
		delete(l.waiting, c)
	}
	l.mu.Unlock()
	if victim != nil {
		victim.Close() // its server goroutine reports StateClosed
	}
}

// oldestWaiting is the waiting connection other than c that has waited longest, or c itself
// when there is none. It stops waiting: it is about to be closed.
func (l *connLimit) oldestWaiting(c net.Conn) net.Conn {
	victim, since := c, time.Time{}
	for w, t := range l.waiting {
		if w != c && (since.IsZero() || t.Before(since)) {
			victim, since = w, t
		}
	}
	delete(l.waiting, victim)
	return victim
}

// Closed is how many connections were closed to stay under the cap.
func (l *connLimit) Closed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}
