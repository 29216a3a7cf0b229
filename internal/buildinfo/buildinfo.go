// Package buildinfo is what a build of agentd knows about itself: its version and commit, and
// the Istio release whose proxy image it is built for. The values are set at link time
// (Makefile, deploy/docker/Dockerfile) with -ldflags "-X github.com/agentd/agentd/internal/buildinfo.NAME=...".
package buildinfo

// Set at build time; the zero values are those of a plain `go build`.
var (
	// Version is agentd's version (git describe).
	Version = "dev"
	// Commit is the commit agentd was built from.
	Commit = "unknown"
	// IstioVersion is the Istio release of the proxy image agentd is built for: the version
	// Envoy's node metadata reports to istiod (ISTIO_VERSION), as Istio's agent reports its own.
	// "unknown" is what pilot-agent built from source reports.
	IstioVersion = "unknown"
)
