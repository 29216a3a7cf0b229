package supervisor_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testing/logbuf"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/agentd/agentd/internal/bus"
	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/supervisor"
)

// binDir holds the test helper (testdata/helper) under each of its names.
var binDir string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "supervisor-test-")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "helper"), "./testdata/helper").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build test helper: %v\n%s", err, out)
			return 1
		}
		for _, mode := range []string{"crash", "hang", "nodrain", "v2"} {
			if err := os.Symlink("helper", filepath.Join(dir, "helper-"+mode)); err != nil {
				panic(err)
			}
		}
		binDir = dir
		code := m.Run()
		if code == 0 {
			if err := goleak.Find(goleak.IgnoreTopFunction("github.com/agentd/agentd/internal/proc.Start.func1.1")); err != nil {
				fmt.Fprintln(os.Stderr, "goroutine leak:", err)
				return 1
			}
		}
		return code
	}()
	os.Exit(code)
}

type fixture struct {
	t    testing.TB
	sup  *supervisor.Supervisor
	bus  *bus.Broker
	root string
	logs *logbuf.Buffer
	stop func() // graceful stop, waits for Run
}

// child describes a test child: the helper under name binary, serving the "echo" socket at
// <root>/<name>.sock.
func child(f *fixture, name, binary string, env ...string) supervisor.Child {
	return supervisor.Child{
		Name:    name,
		Binary:  filepath.Join(binDir, binary),
		Sockets: []supervisor.Socket{{Name: "echo", Network: "unix", Address: name + ".sock"}},
		Launch: func(ctx context.Context, bin string, files []*os.File) (supervisor.Instance, error) {
			return component.Start(ctx, component.Spec{
				Name: name, Binary: bin, Files: files, Sockets: []string{"echo"},
				Env: append(os.Environ(), env...), Root: f.root, Bus: f.bus.Server(),
				Log: hclog.New(&hclog.LoggerOptions{Output: f.logs, Level: hclog.Info}),
			})
		},
	}
}

// start runs a supervisor over the children that build returns until the test ends.
func start(t testing.TB, opts supervisor.Options, build func(*fixture) []supervisor.Child) *fixture {
	t.Helper()
	f := &fixture{t: t, bus: bus.New(), root: t.TempDir(), logs: &logbuf.Buffer{}}
	opts.Root = f.root
	opts.Log = hclog.New(&hclog.LoggerOptions{Output: f.logs, Level: hclog.Info, Name: "agentd"})
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 2 * time.Second
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = 2 * time.Second
	}
	sup, err := supervisor.New(build(f), opts)
	if err != nil {
		t.Fatal(err)
	}
	f.sup = sup
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	var once sync.Once
	f.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(60 * time.Second):
				sup.Kill()
				t.Errorf("Run did not return after its context ended")
				<-done
			}
		})
	}
	t.Cleanup(func() {
		f.stop()
		if t.Failed() {
			t.Logf("supervisor log:\n%s", f.logs.String())
		}
	})
	return f
}

func (f *fixture) status(name string) supervisor.Status {
	for _, s := range f.sup.Statuses() {
		if s.Name == name {
			return s
		}
	}
	f.t.Fatalf("no child %q", name)
	return supervisor.Status{}
}

// waitFor polls cond until it holds, failing the test after a generous deadline: the deadline
// catches a hang, it does not measure speed.
func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s; statuses: %+v", what, f.sup.Statuses())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *fixture) waitRunning(name string) supervisor.Status {
	f.t.Helper()
	f.waitFor(name+" running", func() bool { s := f.status(name); return s.State == supervisor.Running && s.Pid != 0 })
	return f.status(name)
}

// ask sends one line to a child's echo socket and returns the answer line.
func (f *fixture) ask(name, line string) (string, error) {
	c, err := net.DialTimeout("unix", filepath.Join(f.root, name+".sock"), 10*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintln(c, line); err != nil {
		return "", err
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(answer), err
}

func (f *fixture) servingPid(name string) int {
	f.t.Helper()
	got, err := f.ask(name, "pid")
	if err != nil {
		f.t.Fatalf("ask %s for its pid: %v", name, err)
	}
	pid, err := strconv.Atoi(got)
	if err != nil {
		f.t.Fatalf("%s answered %q to pid", name, got)
	}
	return pid
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestKilledChildIsRestartedOnItsSocket(t *testing.T) {
	f := start(t, supervisor.Options{}, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "a", "helper"), child(f, "b", "helper")}
	})
	a, b := f.waitRunning("a"), f.waitRunning("b")
	if got := f.servingPid("a"); got != a.Pid {
		t.Fatalf("a's socket served by pid %d, want %d", got, a.Pid)
	}
	// The helper's own JSON log line, re-logged under its name at its level.
	line := regexp.MustCompile(fmt.Sprintf(`\[WARN\]  a: serving: .*pid=%d`, a.Pid))
	f.waitFor("the helper's log line", func() bool { return line.MatchString(f.logs.String()) })

	if err := syscall.Kill(a.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Dialled at once, while a is down or restarting: the parent owns the socket, so the
	// connection waits in the backlog and the next process answers it.
	got := f.servingPid("a")
	if got == a.Pid {
		t.Fatalf("socket still answered by the killed pid %d", got)
	}
	a2 := f.waitRunning("a")
	if a2.Pid != got || a2.Restarts != 1 {
		t.Errorf("after kill -9: a = pid %d restarts %d, want pid %d restarts 1", a2.Pid, a2.Restarts, got)
	}
	if b2 := f.status("b"); b2.Pid != b.Pid || b2.Restarts != 0 {
		t.Errorf("b was touched: pid %d restarts %d, want pid %d restarts 0", b2.Pid, b2.Restarts, b.Pid)
	}
}

// TestOutOfFDsIsNotACrash: a child killed while agentd has no file descriptor left cannot be
// started again; those failed starts are agentd's, not the child's: no crash loop, no growing
// backoff, and the child is back as soon as descriptors are free again.
func TestOutOfFDsIsNotACrash(t *testing.T) {
	f := start(t, supervisor.Options{}, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "a", "helper")}
	})
	a := f.waitRunning("a")

	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = uint64(openFDCount(t) + 32)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower the fd limit: %v", err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	var hog []*os.File
	release := func() {
		for _, h := range hog {
			h.Close()
		}
		hog = nil
	}
	defer release()
	for {
		h, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		hog = append(hog, h)
	}

	syscall.Kill(a.Pid, syscall.SIGKILL)
	f.waitFor("a failed start", func() bool { return strings.Contains(f.logs.String(), "too many open files") })
	time.Sleep(2 * time.Second) // many failed starts
	if s := f.status("a"); s.State == supervisor.CrashLoop || s.State == supervisor.Running {
		t.Errorf("with agentd out of fds: a is %s, want %s (not the child's fault)", s.State, supervisor.Backoff)
	}
	release()
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	deadline := time.Now().Add(3 * time.Second)
	for f.status("a").State != supervisor.Running {
		if time.Now().After(deadline) {
			t.Fatalf("a not running 3 s after fds were free again: %+v", f.status("a"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processState is pid's state letter in /proc (R, S, T, ...). A process sent SIGSTOP is
// stopped ("T") up to a few ms after kill(2) returns, and may answer a call meanwhile.
func processState(pid int) string {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The state follows the command's name, in parentheses (which may hold ") " too).
	i := strings.LastIndex(string(st), ") ")
	if i < 0 || i+2 >= len(st) {
		return ""
	}
	return string(st[i+2])
}

func openFDCount(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	return len(entries)
}

// TestHungChildIsReplaced: a child stopped dead (SIGSTOP: it holds its connections, answers
// nothing) makes readiness fail with the reason and is left out of the metrics, both in
// bounded time, and is then drained, killed and started again, while the other child is
// left alone. Default options: a hung child is replaced within a few health intervals.
func TestHungChildIsReplaced(t *testing.T) {
	f := start(t, supervisor.Options{}, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "a", "helper"), child(f, "b", "helper")}
	})
	a, b := f.waitRunning("a"), f.waitRunning("b")
	f.waitFor("both ready", func() bool { return f.sup.Ready(context.Background()) == nil })
	if err := syscall.Kill(a.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(a.Pid, syscall.SIGCONT)

	f.waitFor("a stopped", func() bool { return processState(a.Pid) == "T" })
	ready := make(chan error, 1)
	go func() { ready <- f.sup.Ready(context.Background()) }()
	select {
	case err := <-ready:
		if err == nil || !strings.Contains(err.Error(), "a is not ready") {
			t.Errorf("Ready with a hung = %v, want a not ready", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Ready still waiting on the hung child after 10 s")
	}
	type metrics struct {
		texts map[string][]byte
		errs  map[string]error
	}
	mc := make(chan metrics, 1)
	go func() { t, e := f.sup.Metrics(context.Background()); mc <- metrics{t, e} }()
	select {
	case m := <-mc:
		if _, ok := m.texts["b"]; m.errs["a"] == nil || !ok {
			t.Errorf("Metrics with a hung: texts of %v, errors %v; want b's text and a's error", keys(m.texts), m.errs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Metrics still waiting on the hung child after 10 s")
	}

	deadline := time.Now().Add(45 * time.Second)
	for s := f.status("a"); s.Pid == a.Pid || s.State != supervisor.Running; s = f.status("a") {
		if time.Now().After(deadline) {
			t.Fatalf("hung child not replaced after 45 s: %+v", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.waitFor("the hung pid gone", func() bool { return !alive(a.Pid) })
	if err := f.sup.Ready(context.Background()); err != nil {
		t.Errorf("Ready after the replacement: %v", err)
	}
	if s := f.status("b"); s.Pid != b.Pid {
		t.Errorf("b was restarted too: pid %d, want %d", s.Pid, b.Pid)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestCrashLoopLeavesOthersRunning(t *testing.T) {
	opts := supervisor.Options{Backoff: supervisor.BackoffPolicy{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, CrashLoopAfter: 3}}
	f := start(t, opts, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "good", "helper"), child(f, "bad", "helper-crash")}
	})
	good := f.waitRunning("good")
	f.waitFor("bad in crashloop", func() bool { return f.status("bad").State == supervisor.CrashLoop })
	bad := f.status("bad")
	if bad.Restarts < 2 {
		t.Errorf("bad restarts = %d, want at least 2 before crashloop", bad.Restarts)
	}
	if err := f.sup.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "bad") {
		t.Errorf("Ready() = %v, want an error naming bad", err)
	}
	// The crash loop keeps being retried (a fixed binary or environment may come), and the
	// healthy child is untouched.
	f.waitFor("bad retried in crashloop", func() bool { return f.status("bad").Restarts > bad.Restarts })
	if g := f.status("good"); g.Pid != good.Pid || g.State != supervisor.Running {
		t.Errorf("good = %+v, want still running as pid %d", g, good.Pid)
	}
	if got := f.servingPid("good"); got != good.Pid {
		t.Errorf("good served by %d, want %d", got, good.Pid)
	}
}

func TestBackoffGrowsAndResets(t *testing.T) {
	p := supervisor.BackoffPolicy{Initial: 100 * time.Millisecond, Max: time.Second}
	for n, want := range map[int]time.Duration{1: 0, 2: 100 * time.Millisecond, 3: 200 * time.Millisecond, 5: 800 * time.Millisecond, 6: time.Second, 50: time.Second} {
		for range 20 {
			got := supervisor.Delay(p, n)
			if lo, hi := time.Duration(float64(want)*0.8), time.Duration(float64(want)*1.2); got < lo || got > hi {
				t.Fatalf("delay(%d) = %v, want %v ±20%%", n, got, want)
			}
		}
	}
}

// TestBackoffOfQueuedClients: a child serving sockets is never kept down longer than
// MaxQueued, however long its run of exits: its clients wait in the sockets' queues, and a
// resolver gives up after 5 s.
func TestBackoffOfQueuedClients(t *testing.T) {
	p := supervisor.BackoffPolicy{Initial: 100 * time.Millisecond, Max: 30 * time.Second, MaxQueued: 2 * time.Second}
	for n := 1; n <= 50; n++ {
		if got := supervisor.DelayQueued(p, n); got > 2400*time.Millisecond {
			t.Fatalf("delay(%d) of a child with sockets = %v, want at most 2 s +20%%", n, got)
		}
	}
	if got := supervisor.Delay(p, 10); got < 20*time.Second {
		t.Errorf("delay(10) of a child without sockets = %v, want the full backoff (about 26 s)", got)
	}
}

func TestStopInReverseOrderWithinDeadlines(t *testing.T) {
	opts := supervisor.Options{DrainTimeout: 300 * time.Millisecond, StopTimeout: 300 * time.Millisecond}
	f := start(t, opts, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "first", "helper"), child(f, "stubborn", "helper-nodrain"), child(f, "last", "helper")}
	})
	var pids []int
	for _, n := range []string{"first", "stubborn", "last"} {
		pids = append(pids, f.waitRunning(n).Pid)
	}
	f.stop()

	for i, pid := range pids {
		if alive(pid) {
			t.Errorf("child %d (pid %d) still alive after Run returned", i, pid)
		}
	}
	var order []string
	for _, line := range strings.Split(f.logs.String(), "\n") {
		if strings.Contains(line, ": draining:") {
			order = append(order, strings.Fields(strings.Split(line, ": draining:")[0])[2])
		}
	}
	want := []string{"agentd.last", "agentd.stubborn", "agentd.first"}
	if strings.Join(order, ",") != strings.Join(want, ",") {
		t.Errorf("drain order = %v, want %v", order, want)
	}
	if !strings.Contains(f.logs.String(), "drain did not finish") {
		t.Errorf("the stubborn child's drain deadline was not reported")
	}
	for _, s := range f.sup.Statuses() {
		if s.State != supervisor.Stopped {
			t.Errorf("%s is %s after stop, want stopped", s.Name, s.State)
		}
	}
}

func TestKillEndsDeadlinesAtOnce(t *testing.T) {
	opts := supervisor.Options{DrainTimeout: time.Hour, StopTimeout: time.Hour}
	f := start(t, opts, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "stubborn", "helper-nodrain")}
	})
	pid := f.waitRunning("stubborn").Pid
	stopped := make(chan struct{})
	go func() { f.stop(); close(stopped) }()
	f.waitFor("draining", func() bool { return f.status("stubborn").State == supervisor.Draining })
	f.sup.Kill() // the second SIGTERM
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("Kill did not end an hour-long drain")
	}
	if alive(pid) {
		t.Errorf("pid %d alive after Kill", pid)
	}
}

func copyBinary(t testing.TB, dst string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(binDir, "helper"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// TestStatusSHA256OfRunningFile: the SHA-256 that status shows, computed when first asked
// rather than on the start's path, is the one of the file the process runs, even once
// another file has been renamed over its path; a restart runs (and shows) the new one.
func TestStatusSHA256OfRunningFile(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "helper")
	first := copyBinary(t, bin)
	f := start(t, supervisor.Options{}, func(f *fixture) []supervisor.Child {
		c := child(f, "a", "helper")
		c.Binary = bin
		return []supervisor.Child{c}
	})
	pid := f.waitRunning("a").Pid

	// Another file under the same path: the same code with a different tail.
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	data = append(data, "another build"...)
	next := bin + ".next"
	if err := os.WriteFile(next, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, bin); err != nil {
		t.Fatal(err)
	}
	if s := f.status("a"); s.Pid != pid || s.SHA256 != first {
		t.Fatalf("status %+v, want pid %d and the SHA-256 of the file it runs, %s", s, pid, first)
	}

	syscall.Kill(pid, syscall.SIGKILL)
	f.waitFor("restart", func() bool { s := f.status("a"); return s.Pid != pid && s.State == supervisor.Running })
	sum := sha256.Sum256(data)
	if s := f.status("a"); s.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("after the restart: SHA-256 %s, want the new file's %x", s.SHA256, sum)
	}
}

func TestSwap(t *testing.T) {
	f := start(t, supervisor.Options{}, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "a", "helper")}
	})
	old := f.waitRunning("a")
	newBin := filepath.Join(t.TempDir(), "helper")
	sum := copyBinary(t, newBin)

	if err := f.sup.Swap(context.Background(), "a", newBin, sum, 20*time.Second); err != nil {
		t.Fatalf("Swap: %v", err)
	}
	now := f.status("a")
	if now.Pid == old.Pid || now.Binary != newBin || now.SHA256 != sum || now.State != supervisor.Running {
		t.Fatalf("after swap: %+v, want a new pid running %s", now, newBin)
	}
	if alive(old.Pid) {
		t.Errorf("old pid %d still alive after the swap", old.Pid)
	}
	if got := f.servingPid("a"); got != now.Pid {
		t.Errorf("socket served by %d, want the new pid %d", got, now.Pid)
	}

	// Later restarts use the new binary.
	syscall.Kill(now.Pid, syscall.SIGKILL)
	f.waitFor("restart after swap", func() bool { s := f.status("a"); return s.Pid != now.Pid && s.State == supervisor.Running })
	if s := f.status("a"); s.Binary != newBin {
		t.Errorf("restarted from %s, want the swapped-in %s", s.Binary, newBin)
	}
}

func TestSwapRefused(t *testing.T) {
	f := start(t, supervisor.Options{}, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "a", "helper")}
	})
	old := f.waitRunning("a")
	good := filepath.Join(t.TempDir(), "helper")
	copyBinary(t, good)

	tests := []struct {
		name, binary, sha256, want string
	}{
		{"bad checksum", good, strings.Repeat("0", 64), "checksum"},
		{"crashes on start", filepath.Join(binDir, "helper-crash"), "", "exit status 3"},
		{"other protocol version", filepath.Join(binDir, "helper-v2"), "", fmt.Sprintf("plugin protocol %d", component.ProtocolVersion)},
		{"never ready", filepath.Join(binDir, "helper-hang"), "", "hanging on purpose"},
		{"missing binary", filepath.Join(binDir, "nope"), "", "no such file"},
		{"relative path", "helper", "", "relative path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := f.sup.Swap(context.Background(), "a", tt.binary, tt.sha256, 5*time.Second)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Swap(%s) = %v, want an error containing %q", tt.name, err, tt.want)
			}
			s := f.status("a")
			if s.Pid != old.Pid || s.Binary != old.Binary || s.State != supervisor.Running {
				t.Errorf("after a refused swap: %+v, want the old pid %d still running", s, old.Pid)
			}
			if got := f.servingPid("a"); got != old.Pid {
				t.Errorf("socket served by %d, want the old pid %d", got, old.Pid)
			}
		})
	}
	if err := f.sup.Swap(context.Background(), "nobody", good, "", time.Second); err == nil {
		t.Errorf("Swap of an unknown child succeeded")
	}
}

// TestSwapRunsWhatItVerified: while a swap runs, another file is renamed over the binary's
// path again and again. Every swap either runs the build whose checksum it verified, and says
// so, or is refused; none runs the other file.
func TestSwapRunsWhatItVerified(t *testing.T) {
	f := start(t, supervisor.Options{}, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "a", "helper")}
	})
	f.waitRunning("a")
	dir := t.TempDir()
	// Two builds: the test helper, and the same program with bytes appended, which runs but
	// has another SHA-256. Each is written anew and renamed over the path, as `install` does.
	good, err := os.ReadFile(filepath.Join(binDir, "helper"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(good)
	want := hex.EncodeToString(sum[:])
	evil := append(append([]byte{}, good...), "not the verified build"...)
	path := filepath.Join(dir, "helper")
	flip := func(data []byte) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, data, 0o755); err == nil {
			os.Rename(tmp, path)
		}
	}
	flip(good)

	stop := make(chan struct{})
	flipped := make(chan struct{})
	go func() {
		defer close(flipped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			flip([][]byte{evil, good}[i%2])
			time.Sleep(time.Duration(i%3) * time.Millisecond)
		}
	}()
	defer func() { close(stop); <-flipped }()

	swapped := 0
	for i := 0; i < 40 && swapped < 4; i++ {
		err := f.sup.Swap(context.Background(), "a", path, want, 20*time.Second)
		s := f.status("a")
		if err != nil {
			t.Logf("swap %d refused: %v", i, err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		swapped++
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/exe", s.Pid))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != want || s.SHA256 != want {
			t.Fatalf("swap %d: pid %d runs a file of SHA-256 %s, status says %s, want the verified %s", i, s.Pid, got, s.SHA256, want)
		}
	}
	if swapped == 0 {
		t.Errorf("no swap went through: the verified build never ran")
	}
}

func TestSwapRescuesCrashLoop(t *testing.T) {
	opts := supervisor.Options{Backoff: supervisor.BackoffPolicy{Initial: 200 * time.Millisecond, Max: 400 * time.Millisecond, CrashLoopAfter: 2}}
	f := start(t, opts, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "a", "helper-crash")}
	})
	f.waitFor("crashloop", func() bool { return f.status("a").State == supervisor.CrashLoop })
	fixed := filepath.Join(t.TempDir(), "helper")
	copyBinary(t, fixed)
	if err := f.sup.Swap(context.Background(), "a", fixed, "", 20*time.Second); err != nil {
		t.Fatalf("Swap: %v", err)
	}
	s := f.waitRunning("a")
	if s.Binary != fixed {
		t.Errorf("running %s, want %s", s.Binary, fixed)
	}
	if got := f.servingPid("a"); got != s.Pid {
		t.Errorf("socket served by %d, want %d", got, s.Pid)
	}
}

func TestRestartCommand(t *testing.T) {
	f := start(t, supervisor.Options{}, func(f *fixture) []supervisor.Child {
		return []supervisor.Child{child(f, "a", "helper")}
	})
	old := f.waitRunning("a")
	if err := f.sup.Restart(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	s := f.waitRunning("a")
	if s.Pid == old.Pid || s.Restarts != 1 {
		t.Errorf("after restart: %+v, want a new pid and 1 restart", s)
	}
	if alive(old.Pid) {
		t.Errorf("old pid %d alive after restart", old.Pid)
	}
}

func TestRestartedSubscriberGetsRetainedMessage(t *testing.T) {
	f := start(t, supervisor.Options{}, func(f *fixture) []supervisor.Child {
		payload, _ := anypb.New(wrapperspb.String("table-1"))
		if _, err := f.bus.Publish("test", payload); err != nil {
			t.Fatal(err)
		}
		return []supervisor.Child{child(f, "a", "helper", "TESTHELPER_WANT_BUS=1")}
	})
	first := f.waitRunning("a")
	payload, _ := anypb.New(wrapperspb.String("table-2"))
	f.bus.Publish("test", payload)
	f.waitFor("table-2 delivered", func() bool { got, _ := f.ask("a", "bus"); return got == "table-2" })

	syscall.Kill(first.Pid, syscall.SIGKILL)
	// Ready requires a bus message, and the first one a new subscriber gets is the retained one.
	f.waitFor("restart", func() bool { s := f.status("a"); return s.Pid != first.Pid && s.State == supervisor.Running })
	f.waitFor("ready", func() bool { return f.sup.Ready(context.Background()) == nil })
	if got, err := f.ask("a", "bus"); err != nil || got != "table-2" {
		t.Errorf("restarted subscriber has %q (%v), want the retained table-2", got, err)
	}
}
