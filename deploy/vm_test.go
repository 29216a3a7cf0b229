package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAgentdOnAVM runs the real agentd as systemd runs it on an Istio VM: its root holds the
// onboarding files (cluster.env) and NOTIFY_SOCKET is a datagram socket the test reads. It
// checks that agentd takes its identity and control plane from cluster.env as istio-start.sh
// would give them to pilot-agent, tells systemd READY=1 once ready, and STOPPING=1 with its
// stop budget on SIGTERM, then exits 0.
func TestAgentdOnAVM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	bin := binaries(t)
	root := t.TempDir()
	pilot := fmt.Sprintf("127.%d.%d.%d:15010", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1)
	rootCert := filepath.Join(root, "etc/certs/root-cert.pem")
	devplane := exec.Command(filepath.Join(bin, "devplane"), "--xds-address", pilot, "--debug-address", "",
		"--services", "examples/services.yaml", "--ca-root-out", rootCert)
	stopOnCleanup(t, devplane)
	waitUntil(t, "devplane's CA root", func() bool { fi, err := os.Stat(rootCert); return err == nil && fi.Size() > 0 })

	// As `istioctl x workload entry configure` writes it, pointed at the local devplane.
	mustWrite(t, filepath.Join(root, "var/lib/istio/envoy/cluster.env"), fmt.Sprintf(`ISTIO_NAMESPACE='vm-ns'
ISTIO_SERVICE='ratings.vm-ns'
ISTIO_SVC_IP='127.0.0.1'
POD_NAME='vm-1'
SERVICE_ACCOUNT='ratings-sa'
PILOT_ADDRESS='%s'
`, pilot))

	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "notify"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	agentd := exec.Command(filepath.Join(bin, "agentd"), "run", "--root", root, "--helpers-dir", bin, "--disable-envoy",
		"--discovery-address", pilot, "--dns-address", freeAddr(t, true), "--status-port", port(freeAddr(t, false)))
	agentd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notify.LocalAddr().String())
	var logs bytes.Buffer
	agentd.Stdout, agentd.Stderr = &logs, &logs
	exited := stopOnCleanup(t, agentd)
	defer func() {
		if t.Failed() {
			t.Logf("agentd's log:\n%s", logs.String())
		}
	}()

	start := time.Now()
	waitMessage(t, notify, "READY=1\nSTATUS=ready")
	t.Logf("READY=1 after %v", time.Since(start).Round(time.Millisecond))
	var bootstrap struct {
		Node struct{ ID string } `json:"node"`
	}
	data, err := os.ReadFile(filepath.Join(root, "etc/istio/proxy/grpc-bootstrap.json"))
	if err != nil || json.Unmarshal(data, &bootstrap) != nil {
		t.Fatalf("gRPC bootstrap: %v: %s", err, data)
	}
	// POD_NAME from cluster.env, POD_NAMESPACE from ISTIO_NAMESPACE, INSTANCE_IP from ISTIO_SVC_IP.
	if want := "sidecar~127.0.0.1~vm-1.vm-ns~vm-ns.svc.cluster.local"; bootstrap.Node.ID != want {
		t.Errorf("node id %q, want %q", bootstrap.Node.ID, want)
	}
	// The workload certificate came from CA_ADDR (PILOT_ADDRESS) and went to OUTPUT_CERTS
	// (/etc/certs under the root), as istio-start.sh sets them.
	if fi, err := os.Stat(filepath.Join(root, "etc/certs/cert-chain.pem")); err != nil || fi.Size() == 0 {
		t.Errorf("no workload certificate in OUTPUT_CERTS: %v", err)
	}

	stop := time.Now()
	defer func() { t.Logf("stopped %v after SIGTERM", time.Since(stop).Round(time.Millisecond)) }()
	if err := agentd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopping := waitMessage(t, notify, "STOPPING=1\nSTATUS=draining\nEXTEND_TIMEOUT_USEC=")
	if usec := strings.TrimPrefix(stopping, "STOPPING=1\nSTATUS=draining\nEXTEND_TIMEOUT_USEC="); usec == "" || strings.ContainsAny(usec, "\n ") {
		t.Errorf("stop budget %q, want microseconds", usec)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("agentd after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("agentd still running a minute after SIGTERM")
	}
}

// waitMessage reads notify messages until one starts with want, and returns it.
func waitMessage(t *testing.T, c *net.UnixConn, want string) string {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	buf := make([]byte, 4096)
	var seen []string
	for {
		c.SetReadDeadline(deadline)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %q from agentd (got %q): %v", want, seen, err)
		}
		msg := string(buf[:n])
		if strings.HasPrefix(msg, want) {
			return msg
		}
		seen = append(seen, msg)
	}
}

// stopOnCleanup starts cmd and, when the test ends, stops it with SIGTERM (SIGKILL after 30s).
// The channel gets Wait's result.
func stopOnCleanup(t *testing.T, cmd *exec.Cmd) <-chan error {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	exited := make(chan error, 1)
	var result error
	finished := make(chan struct{})
	go func() {
		result = <-done
		close(finished)
		exited <- result
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-finished:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-finished
		}
	})
	return exited
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
