package proc

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/agentd/agentd/internal/proc.Start.func1.1"))
}

// TestReapTakesOrphansNotOwnChildren: as a subreaper, agentd inherits orphans and reaps them,
// while the exit status of its own children still reaches their os/exec Wait.
func TestReapTakesOrphansNotOwnChildren(t *testing.T) {
	if err := BecomeSubreaper(); err != nil {
		t.Skipf("cannot become a subreaper: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	reaped := make(chan struct{})
	go func() { Reap(ctx); close(reaped) }()
	defer func() { cancel(); <-reaped }()

	// Own children exiting with distinct statuses, started while orphans are being reaped.
	var own []*Process
	for range 5 {
		p, err := Start(exec.Command("sh", "-c", "sleep 0.2; exit 7"))
		if err != nil {
			t.Fatal(err)
		}
		own = append(own, p)
	}
	// A shell that leaves an orphan behind: the orphan becomes our child, then a zombie.
	orphanParent, err := Start(exec.Command("sh", "-c", "sleep 0.3 & echo started"))
	if err != nil {
		t.Fatal(err)
	}
	<-orphanParent.Done()

	for _, p := range own {
		select {
		case <-p.Done():
		case <-time.After(30 * time.Second):
			t.Fatal("own child never waited for")
		}
		var ee *exec.ExitError
		if !errors.As(p.Err(), &ee) || ee.ExitCode() != 7 {
			t.Errorf("own child's exit = %v, want status 7 (the reaper must not steal it)", p.Err())
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(zombieChildren(syscall.Getpid())) > 0 || hasChildSleep() {
		if time.Now().After(deadline) {
			t.Fatalf("orphan zombies left: %v", zombieChildren(syscall.Getpid()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hasChildSleep reports whether the orphaned sleep still runs as our child.
func hasChildSleep() bool {
	out, _ := exec.Command("pgrep", "-P", strconv.Itoa(syscall.Getpid()), "sleep").Output()
	return len(out) > 0
}

// liveGroupMembers counts the processes of group pgid that are not zombies.
func liveGroupMembers(pgid int) int {
	out, _ := exec.Command("ps", "-o", "stat=", "-g", strconv.Itoa(pgid)).Output()
	n := 0
	for _, st := range strings.Fields(string(out)) {
		if !strings.HasPrefix(st, "Z") {
			n++
		}
	}
	return n
}

func TestKillEndsTheWholeGroup(t *testing.T) {
	p, err := Start(exec.Command("sh", "-c", "sleep 600 & sleep 600"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the shell start its first sleep
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	deadline := time.Now().Add(10 * time.Second)
	for liveGroupMembers(p.Pid()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still has live members after Kill", p.Pid())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestZombieChildren: a child that exited and was not waited for is listed, from the threads'
// children lists, until it is waited for.
func TestZombieChildren(t *testing.T) {
	if _, ok := childPids(syscall.Getpid()); !ok {
		t.Log("no /proc/<pid>/task/<tid>/children on this kernel: every process's stat is read")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(zombieChildren(syscall.Getpid()), pid) {
		if time.Now().After(deadline) {
			t.Fatalf("exited child %d never listed as a zombie", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(zombieChildren(syscall.Getpid()), pid) {
		t.Errorf("child %d still listed after it was waited for", pid)
	}
}
