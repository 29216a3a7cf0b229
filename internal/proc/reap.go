package proc

import (
	"bytes"
	"context"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// BecomeSubreaper makes agentd the parent of the orphans of its subtree, as PID 1 is.
func BecomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// Reap waits for the zombie children of this process that no Process owns — orphans handed to
// agentd as PID 1 or as a subreaper — until ctx ends. It never waits for any pid (wait4(-1)),
// which would steal the exit status os/exec waits for: it reads /proc for zombies whose parent
// is this process and waits for each unknown one by its pid.
func Reap(ctx context.Context) {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGCHLD)
	defer signal.Stop(sigc)
	tick := time.NewTicker(time.Second) // a SIGCHLD can be coalesced with one for a known child
	defer tick.Stop()
	for {
		reapOrphans()
		select {
		case <-ctx.Done():
			return
		case <-sigc:
		case <-tick.C:
		}
	}
}

// reapOrphans reaps the unknown zombie children once and returns their pids.
func reapOrphans() []int {
	mu.Lock()
	defer mu.Unlock()
	var reaped []int
	for _, pid := range zombieChildren(os.Getpid()) {
		if known[pid] {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			reaped = append(reaped, pid)
		}
	}
	return reaped
}

// zombieChildren lists the pids in state Z whose parent is ppid.
func zombieChildren(ppid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) < 2 || string(f[0]) != "Z" {
			continue
		}
		if p, err := strconv.Atoi(string(f[1])); err == nil && p == ppid {
			pids = append(pids, pid)
		}
	}
	return pids
}
