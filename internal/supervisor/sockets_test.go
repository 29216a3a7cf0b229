package supervisor

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSocketsOutsideThePoller: the sockets agentd holds for its children are not in its Go
// poller, so their traffic does not wake agentd; a socket agentd serves itself is (the check
// can fail).
func TestSocketsOutsideThePoller(t *testing.T) {
	s, err := New([]Child{{Name: "c", Sockets: []Socket{
		{Name: "udp", Network: "udp", Address: "127.0.0.1:0"},
		{Name: "tcp", Network: "tcp", Address: "127.0.0.1:0"},
		{Name: "unix", Network: "unix", Address: "c.sock"},
	}}}, Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.openSockets(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.closeSockets)

	own, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	rc, _ := own.(*net.UDPConn).SyscallConn()
	var ownFd int
	rc.Control(func(fd uintptr) { ownFd = int(fd) })

	polled := pollerFds(t)
	if !polled[ownFd] {
		t.Fatalf("agentd's own socket %d is not among the poller's descriptors %v", ownFd, polled)
	}
	for i, f := range s.children[0].files {
		if fd := int(f.Fd()); polled[fd] {
			t.Errorf("socket %s (descriptor %d) is in agentd's poller", s.children[0].Sockets[i].Name, fd)
		}
	}
}

// pollerFds returns the descriptors registered with this process's epoll instances.
func pollerFds(t *testing.T) map[int]bool {
	t.Helper()
	fds := map[int]bool{}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if link, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); link != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.Open(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(info)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "tfd:" {
				if n, err := strconv.Atoi(f[1]); err == nil {
					fds[n] = true
				}
			}
		}
		info.Close()
	}
	return fds
}
