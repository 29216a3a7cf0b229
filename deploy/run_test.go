package deploy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRunScriptSmoke runs the quickstart (scripts/run.sh, what `make run` starts) with
// --smoke: devplane, a backend and agentd start, the commands it tells the reader to try are
// run and checked, and everything stops.
func TestRunScriptSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	bin := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "scripts/run.sh", "--smoke")
	cmd.Dir = ".."
	// At the deadline run.sh gets SIGTERM, on which it stops what it started.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	// 15010 is istiod's plaintext port (agentd dials it without TLS): a random loopback
	// address keeps it apart from anything else on the machine.
	cmd.Env = append(os.Environ(),
		"BIN="+bin,
		"RUN_DIR="+filepath.Join(t.TempDir(), "run"),
		fmt.Sprintf("XDS_ADDR=127.%d.%d.%d:15010", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1),
		"DNS_ADDR="+freeAddr(t, true),
		"STATUS_PORT="+port(freeAddr(t, false)),
		"BACKEND_ADDR="+freeAddr(t, false),
		"DEBUG_ADDR="+freeAddr(t, false),
	)
	out, err := cmd.CombinedOutput()
	t.Logf("run.sh --smoke:\n%s", out)
	if err != nil {
		t.Fatalf("run.sh --smoke: %v", err)
	}
	for _, want := range []string{"smoke: ok   agentd status: ready", "smoke: ok   proxyless gRPC calls", "smoke: ok   readiness 200",
		"smoke: ok   metrics", "smoke: ok   WasmPlugin", "smoke: ok   swap dns-proxy", "run: stopped"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("run.sh output lacks %q", want)
		}
	}
	if strings.Contains(string(out), "FAIL") {
		t.Error("a smoke check failed")
	}
}

// freeAddr returns a loopback address free for TCP (and UDP too, with udp).
func freeAddr(t *testing.T, udp bool) string {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if !udp {
			return addr
		}
		if pc, err := net.ListenPacket("udp", addr); err == nil {
			pc.Close()
			return addr
		}
	}
	t.Fatal("no free address")
	return ""
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	if _, err := strconv.Atoi(p); err != nil {
		panic(addr)
	}
	return p
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds every command of agentd's module once for the tests, and returns their
// directory.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "agentd-deploy-bin"); buildErr != nil {
			return
		}
		build := exec.Command("go", "build", "-o", binDir+"/", "./cmd/...")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/...: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}
