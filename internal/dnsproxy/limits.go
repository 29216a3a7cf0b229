package dnsproxy

import (
	"fmt"

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
