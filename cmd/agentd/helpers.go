package main

import (
	"path/filepath"

	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/dnsproxy"
	"github.com/agentd/agentd/internal/prober"
	"github.com/agentd/agentd/internal/sds"
	"github.com/agentd/agentd/internal/xdsproxy"
)

// helpers are the helpers agentd's own binary can serve, by the name it is run as: a helpers
// directory of links to agentd (dns-proxy -> agentd, ...) runs every process of the tree
// from one executable file, whose pages the kernel then maps once for all of them instead of
// once per helper binary (scripts/bench/footprint.sh measures both layouts). The helpers'
// own binaries (cmd/dns-proxy, ...) stay, for swapping one helper for another build.
var helpers = map[string]component.Factory{
	"dns-proxy":  dnsproxy.New,
	"xds-proxy":  xdsproxy.New,
	"sds-server": sds.New,
	"prober":     prober.New,
}

// serveHelper serves the helper that arg0 names, if it names one, and reports whether it did.
func serveHelper(arg0 string) bool {
	name := filepath.Base(arg0)
	newHelper, ok := helpers[name]
	if ok {
		component.Serve(name, newHelper)
	}
	return ok
}
