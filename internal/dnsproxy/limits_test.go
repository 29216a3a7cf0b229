package dnsproxy

import (
	"fmt"
	"testing"

	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

func TestCheckNameTable(t *testing.T) {
	table := func(n int) *ndsv1.NameTable {
		nt := &ndsv1.NameTable{Table: make(map[string]*ndsv1.NameTable_NameInfo, n)}
		for i := range n {
			nt.Table[fmt.Sprintf("svc%d.ns.svc.cluster.local", i)] = &ndsv1.NameTable_NameInfo{Ips: []string{"10.0.0.1"}}
		}
		return nt
	}
	for _, tt := range []struct {
		n  int
		ok bool
	}{{0, true}, {1, true}, {MaxNameTableEntries, true}, {MaxNameTableEntries + 1, false}} {
		if err := checkNameTable(table(tt.n)); (err == nil) != tt.ok {
			t.Errorf("checkNameTable(%d entries) = %v, want ok %v", tt.n, err, tt.ok)
		}
	}
}
