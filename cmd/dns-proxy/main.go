// Command dns-proxy is agentd's DNS helper: it answers mesh names from Istio's name table and
// forwards the rest upstream, on the sockets agentd hands down. agentd starts it as a
// go-plugin child.
package main

import (
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/dnsproxy"
)

func main() {
	udp := blockingDatagramSockets()
	// Each UDP socket's reader waits for queries in a blocking read that holds a P. With a P
	// to spare, Go's sysmon leaves it there (it takes a P back from a system call only when
	// none is idle, or after 10 ms); with one P it took it every 20 µs, and the reader
	// hopped between threads at a cost in CPU per query. GOMAXPROCS still wins.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(udp + 1)
	}
	component.Serve("dns-proxy", dnsproxy.New)
}

// blockingDatagramSockets puts the inherited UDP sockets (LISTEN_FDS, from fd 3) in blocking
// mode before they are wrapped in os.Files, and returns how many there are. Go puts a
// descriptor that is non-blocking when wrapped in its poller, which then wakes an idle thread
// for every datagram read or written; the mode belongs to the socket, and another process
// sharing it can have left it non-blocking (a dns-proxy starting up does, for a moment, when
// net.FilePacketConn wraps it). dnsproxy reads them with blocking system calls, outside the
// poller.
func blockingDatagramSockets() int {
	n, err := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	if err != nil {
		return 0
	}
	udp := 0
	for fd := 3; fd < 3+n; fd++ {
		if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err == nil && typ == unix.SOCK_DGRAM {
			unix.SetNonblock(fd, false)
			udp++
		}
	}
	return udp
}
