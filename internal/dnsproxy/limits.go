package dnsproxy

import (
	"errors"
	"fmt"
	"net"
	"time"

	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// MaxNameTableEntries bounds the name table dns-proxy builds: ten times the 10 000 names of
// the footprint benchmark, far beyond a proxy's scope in any mesh (istiod sends the services
// visible to the proxy). Each entry costs a few kilobytes once its variants and answers are
// built; a larger table, from a misbehaving control plane, is refused and the current one
// kept, as a rejected xDS update is.
const MaxNameTableEntries = 100_000

// checkNameTable returns why nt must not be built, or nil.
func checkNameTable(nt *ndsv1.NameTable) error {
	if n := len(nt.GetTable()); n > MaxNameTableEntries {
		return fmt.Errorf("%d entries, more than %d", n, MaxNameTableEntries)
	}
	return nil
}

// backoffListener waits before accepting again after a temporary error: out of file
// descriptors (EMFILE), a retry at once fails at once, and miekg's server would retry in a
// busy loop. The wait doubles from 5 ms to 1 s, as net/http's does, and resets on success.
type backoffListener struct {
	net.Listener
	sleep func(time.Duration) // time.Sleep; tests count instead
}

func (l backoffListener) Accept() (net.Conn, error) {
	var wait time.Duration
	for {
		c, err := l.Listener.Accept()
		var ne net.Error
		if err == nil || !errors.As(err, &ne) || !ne.Temporary() { //nolint:staticcheck // EMFILE is only flagged as temporary
			return c, err
		}
		wait = min(max(2*wait, 5*time.Millisecond), time.Second)
		l.sleep(wait)
	}
}
