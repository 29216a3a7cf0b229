package component

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/peercred"
)

// Helper is one running helper: what a helper binary builds from its Env and hands to Serve.
type Helper interface {
	// Run serves until ctx ends and returns nil on a clean stop. An error ends the
	// process with a non-zero status, and agentd restarts it.
	Run(ctx context.Context) error
	// Ready returns nil when the helper serves, or the reason it does not yet.
	Ready() error
}

// Drainer is implemented by helpers that can finish in-flight work before they stop: Drain
// stops taking new work and returns when the old is done or ctx's deadline has passed.
// Run's context is cancelled after Drain returns.
type Drainer interface {
	Drain(ctx context.Context) error
}

// Factory builds a helper from its environment; an error fails Configure with that message
// (say what was wrong with the configuration).
type Factory func(env *Env) (Helper, error)

// Env is what agentd hands a helper: its configuration, its inherited sockets, the bus, a
// logger and a metrics registry whose metrics agentd merges into its own.
type Env struct {
	Name    string
	Root    string // where Istio's relative paths (etc/istio/proxy, var/run/secrets, ...) live
	Config  *anypb.Any
	Log     hclog.Logger
	Bus     *Bus
	Metrics *prometheus.Registry

	files map[string]*os.File // inherited sockets by name
}

// UnmarshalConfig decodes the typed configuration into m. An absent configuration leaves m
// as it is.
func (e *Env) UnmarshalConfig(m proto.Message) error {
	if e.Config == nil {
		return nil
	}
	if err := e.Config.UnmarshalTo(m); err != nil {
		return fmt.Errorf("decode %s configuration: %w", e.Name, err)
	}
	return nil
}

// Listener returns the inherited stream socket (TCP or Unix) with that name.
func (e *Env) Listener(name string) (net.Listener, error) {
	f, err := e.file(name)
	if err != nil {
		return nil, err
	}
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("inherited socket %q: %w", name, err)
	}
	return l, nil
}

// OwnerListener returns the inherited Unix stream socket with that name, refusing clients of
// other users than root and the helper's own (peercred): for a socket whose file mode must
// stay open to all, as Istio's SDS socket is.
func (e *Env) OwnerListener(name string) (net.Listener, error) {
	l, err := e.Listener(name)
	if err != nil {
		return nil, err
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil, fmt.Errorf("inherited socket %q is not a Unix socket", name)
	}
	return peercred.OwnerOnly(ul), nil
}

// PacketConn returns the inherited datagram socket (UDP) with that name.
func (e *Env) PacketConn(name string) (net.PacketConn, error) {
	f, err := e.file(name)
	if err != nil {
		return nil, err
	}
	pc, err := net.FilePacketConn(f)
	if err != nil {
		return nil, fmt.Errorf("inherited socket %q: %w", name, err)
	}
	return pc, nil
}

// State is memory agentd keeps for this helper across its processes, a memfd the helper
// sizes and maps: what one process left there, the next finds after a crash or a kill -9.
// Nil when agentd handed none down.
func (e *Env) State() *os.File { return e.files[StateFileName] }

// HasSocket reports whether agentd handed down a socket with that name.
func (e *Env) HasSocket(name string) bool {
	_, ok := e.files[name]
	return ok
}

func (e *Env) file(name string) (*os.File, error) {
	f, ok := e.files[name]
	if !ok {
		return nil, fmt.Errorf("no inherited socket named %q", name)
	}
	return f, nil
}
