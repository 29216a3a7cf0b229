package proc

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
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
// is this process and waits for each unknown one by its pid. It returns nil: a task like
// every other of agentd's.
func Reap(ctx context.Context) error {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGCHLD)
	defer signal.Stop(sigc)
	tick := time.NewTicker(time.Second) // a SIGCHLD can be coalesced with one for a known child
	defer tick.Stop()
	for {
		reapOrphans()
		select {
		case <-ctx.Done():
			return nil
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

// zombieChildren lists the pids in state Z whose parent is ppid. It reads the children lists
// of ppid's threads (/proc/<ppid>/task/<tid>/children: a few short files), or, on a kernel
// without them, every process's stat.
func zombieChildren(ppid int) []int {
	candidates, ok := childPids(ppid)
	if !ok {
		candidates = allPids()
	}
	var pids []int
	for _, pid := range candidates {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
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

// childPids returns the children of ppid's threads, and false when the kernel does not list
// them (CONFIG_PROC_CHILDREN).
func childPids(ppid int) ([]int, bool) {
	dir := "/proc/" + strconv.Itoa(ppid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil, false
	}
	var pids []int
	for _, t := range tasks {
		list, err := os.ReadFile(dir + "/" + t.Name() + "/children")
		if errors.Is(err, fs.ErrNotExist) {
			if _, statErr := os.Stat(dir + "/" + t.Name()); statErr == nil {
				return nil, false // the thread is there, its children list is not
			}
		}
		for _, f := range bytes.Fields(list) {
			if pid, err := strconv.Atoi(string(f)); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids, true
}

// allPids returns the pids of every process in /proc.
func allPids() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
