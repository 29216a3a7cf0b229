package supervisor

import (
	"context"
	"os"
	"time"
)

// Instance is one running process of a child: a go-plugin helper or Envoy.
type Instance interface {
	// Pid is the process id.
	Pid() int
	// Ready returns nil when the process serves, or the reason it does not yet.
	Ready(ctx context.Context) error
	// Drain asks the process to finish its work before ctx's deadline; it keeps running.
	Drain(ctx context.Context) error
	// Stop ends the process: gracefully, then SIGKILL of its process group when ctx ends.
	// It returns once the process has exited.
	Stop(ctx context.Context) error
	// Exited is closed when the process has exited; Err then tells how.
	Exited() <-chan struct{}
	Err() error
	// Metrics returns the process's metrics in the Prometheus text format.
	Metrics(ctx context.Context) ([]byte, error)
}

// Launch starts one process of a child. binary is the child's current binary (a swap
// changes it); files are the child's sockets, opened by agentd, in the order of Child.Sockets.
type Launch func(ctx context.Context, binary string, files []*os.File) (Instance, error)

// Socket is a listening socket agentd opens once and hands down to the child that serves it,
// so that it outlives every process of that child.
type Socket struct {
	Name    string      // the LISTEN_FDNAMES name the child looks it up by
	Network string      // "unix", "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6"
	Address string      // a path for "unix" (relative paths are under the root), else host:port
	Mode    os.FileMode // permissions of a Unix socket (default 0600)
}

// Child describes one supervised child as data. Children start side by side and stop in the
// reverse order of the list.
type Child struct {
	Name    string
	Binary  string
	Sockets []Socket
	Launch  Launch
	// Per-child deadlines; zero takes the supervisor's (Options). Envoy waits on its control
	// plane longer than a helper may take to start, and drains for as long as it is told to.
	ReadyTimeout time.Duration
	DrainTimeout time.Duration
}
