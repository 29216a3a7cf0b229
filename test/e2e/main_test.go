// Package e2e holds agentd's multi-process tests: the real binaries, built once in TestMain,
// run as separate processes on loopback addresses and temp directories, with real clients.
package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testing/logbuf"

	"github.com/agentd/agentd/internal/agent"
	"github.com/agentd/agentd/internal/control"
	"github.com/agentd/agentd/internal/testing/ca"
)

// binDir holds every binary under cmd/ (and the test stand-ins under test/), built once.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "agentd-e2e-")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		pkgs := []string{"../../cmd/..."}
		if _, err := os.Stat("../envoy-standin"); err == nil {
			pkgs = append(pkgs, "../envoy-standin")
		}
		build := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build binaries: %v\n%s", err, out)
			return 1
		}
		binDir = dir
		// A CA for every agentd: sds-server serves the workload certificate it signs.
		stop, err := startTestCA(dir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "start the test CA: %v\n", err)
			return 1
		}
		defer stop()
		return m.Run()
	}())
}

// caEnv points agentd's sds-server at the in-process test CA (CA_ADDR, CA_ROOT_CA).
var caEnv []string

// podEnv is what a pod with a liveness probe gives its istio-proxy container: the rewritten
// probe, which the prober serves (without one there is no prober: TestNoProberWithoutProbes).
var podEnv = []string{`ISTIO_KUBE_APP_PROBERS={"/app-health/app/livez":{"httpGet":{"path":"/healthz","port":8080}}}`}

// startTestCA serves a CA (Istio's CA API over TLS) on a loopback port for the whole run.
func startTestCA(dir string) (stop func(), err error) {
	root := filepath.Join(dir, "test-ca-root.pem")
	authority, err := ca.New(ca.Options{RootFile: root})
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	caEnv = []string{"CA_ADDR=" + l.Addr().String(), "CA_ROOT_CA=" + root, "ECC_SIGNATURE_ALGORITHM=ECDSA"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = authority.Run(ctx, l) }()
	return func() { cancel(); <-done }, nil
}

// bin is the path of a built binary.
func bin(name string) string { return filepath.Join(binDir, name) }

// Agentd is an `agentd run` process started by a test.
type Agentd struct {
	t    *testing.T
	Root string
	Log  *logbuf.Buffer
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startAgentd runs `agentd run` in a temp root with the built helpers, on a free DNS port,
// with extra flags args and environment env, and waits until agentd's control socket answers.
// The test's cleanup stops it (SIGTERM, then SIGKILL of its whole process group).
func startAgentd(t *testing.T, env []string, args ...string) *Agentd {
	t.Helper()
	root := t.TempDir()
	a := &Agentd{t: t, Root: root, Log: &logbuf.Buffer{}, done: make(chan struct{})}
	full := append([]string{"run", "--root", root, "--helpers-dir", binDir, "--dns-address", "127.0.0.1:0",
		"--status-port", strconv.Itoa(freePort(t))}, args...) // a later --status-port wins
	a.cmd = exec.Command(bin("agentd"), full...)
	a.cmd.Env = slices.Concat(os.Environ(), caEnv, podEnv, env) // the test's env wins
	a.cmd.Stdout, a.cmd.Stderr = a.Log, a.Log
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.err = a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		a.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		case <-time.After(60 * time.Second):
			t.Errorf("agentd did not stop within 60 s of SIGTERM")
		}
		syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
		if t.Failed() {
			t.Logf("agentd log:\n%s", a.Log.String())
		}
	})
	waitFor(t, "agentd's control socket", func() bool {
		_, err := a.Status()
		return err == nil
	})
	return a
}

// Pid is agentd's own pid.
func (a *Agentd) Pid() int { return a.cmd.Process.Pid }

// Signal sends sig to agentd.
func (a *Agentd) Signal(sig syscall.Signal) { a.cmd.Process.Signal(sig) }

// Wait waits (bounded) for agentd to exit and returns its exit code.
func (a *Agentd) Wait() int {
	a.t.Helper()
	select {
	case <-a.done:
	case <-time.After(60 * time.Second):
		a.t.Fatalf("agentd did not exit")
	}
	return a.cmd.ProcessState.ExitCode()
}

// Status asks the control socket.
func (a *Agentd) Status() (control.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return control.NewClient(agent.ControlSocket(a.Root)).Status(ctx)
}

// WaitReady waits until agentd says it is ready.
func (a *Agentd) WaitReady() control.Status {
	a.t.Helper()
	var st control.Status
	waitFor(a.t, "agentd ready", func() bool {
		var err error
		st, err = a.Status()
		return err == nil && st.Ready
	})
	return st
}

// CLI runs `agentd SUB --root ROOT ARGS...` and returns its combined output.
func (a *Agentd) CLI(sub string, args ...string) (string, error) {
	cmd := exec.Command(bin("agentd"), append([]string{sub, "--root", a.Root}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// waitFor polls cond until it holds; the generous deadline catches hangs, not slowness.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// alive reports whether a process exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	return i > 0 && len(data) > i+2 && data[i+2] != 'Z'
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
