package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testing/logbuf"

	"github.com/agentd/agentd/internal/envoy"
	"github.com/agentd/agentd/internal/envoy/bootstrap"
)

// envoyBinary is a real envoy when one is on PATH, else the stand-in (test/envoy-standin).
func envoyBinary(t *testing.T) string {
	if p, err := exec.LookPath("envoy"); err == nil {
		t.Logf("using the real envoy at %s", p)
		return p
	}
	return bin("envoy-standin")
}

// envoyTree is an `agentd run` with Envoy, devplane for xDS and certificates, on free ports.
type envoyTree struct {
	*Agentd
	admin      *envoy.Admin
	statusPort int // agentd's status server
	readyPort  int // Envoy's readiness listener (ENVOY_STATUS_PORT)
}

func startEnvoyTree(t *testing.T, proxyConfig string, env ...string) *envoyTree {
	t.Helper()
	caAddr, rootFile, xdsAddr := sdsDevplane(t, time.Hour)
	adminPort, statusPort, readyPort := freePort(t), freePort(t), freePort(t)
	pc := fmt.Sprintf(`{"controlPlaneAuthPolicy":"NONE","proxyAdminPort":%d%s}`, adminPort, proxyConfig)
	env = append([]string{
		"CA_ADDR=" + caAddr, "CA_ROOT_CA=" + rootFile, "ECC_SIGNATURE_ALGORITHM=ECDSA",
		"POD_NAME=app-1", "POD_NAMESPACE=ns", "SERVICE_ACCOUNT=sa", "INSTANCE_IP=127.0.0.1",
		"PROXY_CONFIG=" + pc,
		"ENVOY_STATUS_PORT=" + strconv.Itoa(readyPort), "ENVOY_PROMETHEUS_PORT=" + strconv.Itoa(freePort(t)),
	}, env...)
	a := startAgentd(t, env, "--discovery-address", xdsAddr, "--envoy-binary", envoyBinary(t),
		"--status-port", strconv.Itoa(statusPort))
	return &envoyTree{Agentd: a, admin: envoy.NewAdmin("127.0.0.1", adminPort), statusPort: statusPort, readyPort: readyPort}
}

// get returns the status code of GET url (0 when it fails).
func httpStatus(method, url string) int {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return 0
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (e *envoyTree) stat(t *testing.T, name string) uint64 {
	t.Helper()
	stats, err := e.admin.Stats(context.Background(), "^"+strings.ReplaceAll(name, ".", `\.`)+"$")
	if err != nil || len(stats) != 1 {
		return 0
	}
	v, _ := stats[0].Uint()
	return v
}

// TestEnvoyReadyAfterXDS: agentd is ready only once Envoy has accepted its first CDS and LDS
// answers, which come from devplane through xds-proxy.
func TestEnvoyReadyAfterXDS(t *testing.T) {
	tree := startEnvoyTree(t, "")
	st := tree.WaitReady()
	if cds, lds := tree.stat(t, "cluster_manager.cds.update_success"), tree.stat(t, "listener_manager.lds.update_success"); cds == 0 || lds == 0 {
		t.Errorf("agentd ready with cds %d and lds %d accepted updates; want both > 0", cds, lds)
	}
	pids := childPids(t, st)
	if pids["envoy"] == 0 {
		t.Fatalf("no envoy child in %+v", st.Children)
	}
	if _, err := os.Stat(filepath.Join(tree.Root, bootstrap.File)); err != nil {
		t.Errorf("bootstrap: %v", err)
	}
	// The kubelet's readiness probe goes through Envoy's 15021 listener to the status server.
	if code := httpStatus("GET", fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", tree.readyPort)); code != 200 {
		t.Errorf("GET /healthz/ready through Envoy = %d, want 200", code)
	}
}

// TestEnvoyKill9Restarted: a kill -9 of Envoy restarts Envoy alone; the helpers keep their pids.
func TestEnvoyKill9Restarted(t *testing.T) {
	tree := startEnvoyTree(t, "")
	before := childPids(t, tree.WaitReady())
	if err := syscall.Kill(before["envoy"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var after map[string]int
	waitFor(t, "a new ready envoy", func() bool {
		st, err := tree.Status()
		if err != nil || !st.Ready {
			return false
		}
		after = childPids(t, st)
		return after["envoy"] != 0 && after["envoy"] != before["envoy"]
	})
	for _, h := range helpers {
		if after[h] != before[h] {
			t.Errorf("%s pid %d → %d: a helper was touched by Envoy's restart", h, before[h], after[h])
		}
	}
	if alive(before["envoy"]) {
		t.Errorf("the killed envoy (pid %d) is still there", before["envoy"])
	}
}

// TestEnvoyDrainWaitsForClient: with EXIT_ON_ZERO_ACTIVE_CONNECTIONS, SIGTERM drains Envoy and
// agentd waits until the open client connection closes, then the whole tree exits 0, each
// step visible in the log in order.
func TestEnvoyDrainWaitsForClient(t *testing.T) {
	// An inbound TCP listener of our own on a free port, added as Istio lets one add to the
	// bootstrap: ISTIO_BOOTSTRAP_OVERRIDE (devplane's 15001 may be taken on a shared machine).
	port := freePort(t)
	override := filepath.Join(t.TempDir(), "override.yaml")
	if err := os.WriteFile(override, []byte(fmt.Sprintf(`static_resources:
  listeners:
  - name: e2e_inbound
    traffic_direction: INBOUND
    address: {socket_address: {address: 127.0.0.1, port_value: %d}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: e2e
          cluster: prometheus_stats
`, port)), 0o644); err != nil {
		t.Fatal(err)
	}
	tree := startEnvoyTree(t, "", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "MINIMUM_DRAIN_DURATION=500ms",
		"ISTIO_BOOTSTRAP_OVERRIDE="+override)
	pids := childPids(t, tree.WaitReady())
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("connect to Envoy's inbound listener: %v", err)
	}
	defer conn.Close()
	waitFor(t, "the connection to be counted", func() bool {
		return tree.stat(t, fmt.Sprintf("listener.127.0.0.1_%d.downstream_cx_active", port)) == 1
	})
	tree.Signal(syscall.SIGTERM)
	waitFor(t, "two checks that see the open connection", func() bool {
		return strings.Count(tree.Log.String(), "there are still active connections") >= 2
	})
	if code := httpStatus("GET", fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", tree.readyPort)); code != 503 {
		t.Errorf("GET /healthz/ready through Envoy while draining = %d, want 503", code)
	}
	select {
	case <-tree.done:
		t.Fatal("agentd exited while a client connection was open")
	default:
	}
	for name, pid := range pids {
		if !alive(pid) {
			t.Errorf("%s (pid %d) stopped while Envoy drains", name, pid)
		}
	}
	conn.Close()
	if code := tree.Wait(); code != 0 {
		t.Errorf("agentd exited %d, want 0", code)
	}
	assertOrder(t, tree.Log.String(),
		"signal: stopping gracefully", "draining Envoy's listeners", "there are still active connections",
		"there are no more active connections", "stopping Envoy", "Envoy exited", "sds-server: draining")
	for name, pid := range pids {
		if alive(pid) {
			t.Errorf("%s (pid %d) outlived agentd", name, pid)
		}
	}
}

// TestEnvoyDrainTerminationDuration: without EXIT_ON_ZERO_ACTIVE_CONNECTIONS the drain lasts
// the ProxyConfig's terminationDrainDuration, then the tree exits 0.
func TestEnvoyDrainTerminationDuration(t *testing.T) {
	tree := startEnvoyTree(t, `,"terminationDrainDuration":"2s"`)
	tree.WaitReady()
	start := time.Now()
	tree.Signal(syscall.SIGTERM)
	if code := tree.Wait(); code != 0 {
		t.Errorf("agentd exited %d, want 0", code)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("the tree stopped %v after SIGTERM, before the 2s termination drain duration", d)
	}
	assertOrder(t, tree.Log.String(), "draining Envoy's listeners", "graceful termination period, starting",
		"graceful termination period complete", "stopping Envoy")
}

// TestEnvoyQuitQuitQuit: POST /quitquitquit on the status port stops the tree without
// draining Envoy (Jobs and CronJobs use it), exit status 0.
func TestEnvoyQuitQuitQuit(t *testing.T) {
	tree := startEnvoyTree(t, `,"terminationDrainDuration":"60s"`)
	tree.WaitReady()
	if code := httpStatus("POST", fmt.Sprintf("http://127.0.0.1:%d/quitquitquit", tree.statusPort)); code != 200 {
		t.Fatalf("POST /quitquitquit = %d", code)
	}
	if code := tree.Wait(); code != 0 { // well before the 60 s drain: Wait gives up at 60 s
		t.Errorf("agentd exited %d, want 0", code)
	}
	assertOrder(t, tree.Log.String(), "skipping drain", "stopping Envoy", "Envoy exited normally")
	if strings.Contains(tree.Log.String(), "draining Envoy's listeners") {
		t.Error("Envoy was drained after /quitquitquit")
	}
}

// TestEnvoyDrainEndpoint: POST /drain (native sidecars' preStop) drains Envoy now, and the
// SIGTERM that follows stops the tree at once.
func TestEnvoyDrainEndpoint(t *testing.T) {
	tree := startEnvoyTree(t, `,"terminationDrainDuration":"60s"`)
	tree.WaitReady()
	if code := httpStatus("POST", fmt.Sprintf("http://127.0.0.1:%d/drain", tree.statusPort)); code != 200 {
		t.Fatalf("POST /drain = %d", code)
	}
	waitFor(t, "Envoy to drain", func() bool { return tree.stat(t, "server.state") == 1 })
	tree.Signal(syscall.SIGTERM)
	if code := tree.Wait(); code != 0 {
		t.Errorf("agentd exited %d, want 0", code)
	}
	assertOrder(t, tree.Log.String(), "signal: stopping gracefully", "skipping drain", "stopping Envoy")
}

// TestProxySidecarCommand: `pilot-agent proxy sidecar` (agentd under that name) with the exact arguments of Istio's
// injection template, run as the container runs it (working directory = root), starts the
// same tree as `agentd run`.
func TestProxySidecarCommand(t *testing.T) {
	caAddr, rootFile, xdsAddr := sdsDevplane(t, time.Hour)
	root := t.TempDir()
	adminPort, statusPort := freePort(t), freePort(t)
	// As the istio-proxy image runs it: a binary named pilot-agent (a link to agentd).
	pilotAgent := filepath.Join(binDir, "pilot-agent")
	if err := os.Symlink(bin("agentd"), pilotAgent); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	cmd := exec.Command(pilotAgent, "proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local",
		"--proxyLogLevel=warning", "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info")
	cmd.Dir = root
	cmd.Env = append(append(os.Environ(), podEnv...),
		"CA_ADDR="+caAddr, "CA_ROOT_CA="+rootFile, "ECC_SIGNATURE_ALGORITHM=ECDSA",
		"POD_NAME=app-1", "POD_NAMESPACE=ns", "SERVICE_ACCOUNT=sa", "INSTANCE_IP=127.0.0.1", "DNS_PROXY_ADDR=127.0.0.1:0",
		fmt.Sprintf(`PROXY_CONFIG={"binaryPath":%q,"discoveryAddress":%q,"controlPlaneAuthPolicy":"NONE","proxyAdminPort":%d,"statusPort":%d}`,
			envoyBinary(t), xdsAddr, adminPort, statusPort),
		"ENVOY_STATUS_PORT="+strconv.Itoa(freePort(t)), "ENVOY_PROMETHEUS_PORT="+strconv.Itoa(freePort(t)))
	a := &Agentd{t: t, Root: root, Log: &logbuf.Buffer{}, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = a.Log, a.Log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.err = cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		a.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		case <-time.After(60 * time.Second):
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
		if t.Failed() {
			t.Logf("agentd log:\n%s", a.Log.String())
		}
	})
	waitFor(t, "agentd's control socket", func() bool { _, err := a.Status(); return err == nil })
	st := a.WaitReady()
	var names []string
	for _, c := range st.Children {
		names = append(names, c.Name)
	}
	if want := append(append([]string{}, helpers...), "envoy"); strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("children = %v, want %v", names, want)
	}
	if code := httpStatus("GET", fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", statusPort)); code != 200 {
		t.Errorf("status server on the ProxyConfig's statusPort: GET /healthz/ready = %d, want 200", code)
	}
	info, err := envoy.NewAdmin("127.0.0.1", adminPort).ServerInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if id := info.GetNode().GetId(); id != "sidecar~127.0.0.1~app-1.ns~$(POD_NAMESPACE).svc.cluster.local" {
		// The kubelet expands $(POD_NAMESPACE) before the container starts; here nothing does.
		t.Errorf("node id = %q", id)
	}
	a.Signal(syscall.SIGTERM)
	if code := a.Wait(); code != 0 {
		t.Errorf("agentd proxy exited %d after SIGTERM, want 0", code)
	}
}

// assertOrder checks that each text appears in log after the one before it.
func assertOrder(t *testing.T, log string, texts ...string) {
	t.Helper()
	at := 0
	for _, s := range texts {
		i := strings.Index(log[at:], s)
		if i < 0 {
			t.Errorf("log lacks %q after the earlier steps %v", s, texts)
			return
		}
		at += i + len(s)
	}
}

// TestEnvoyExitStopsAgentd: Envoy exiting 0 (POST :15000/quitquitquit, as a Job's sidecar is
// told to finish) stops agentd, exit 0, as Istio's agent; so does any exit of Envoy with
// AGENTD_EXIT_ON_ENVOY_EXIT (Istio's behaviour on a crash). Envoy is not started again. A crash
// without it is restarted in place (TestEnvoyKill9Restarted and the chaos test).
func TestEnvoyExitStopsAgentd(t *testing.T) {
	tests := []struct {
		name  string // short: the root's Unix socket paths hold it
		env   []string
		exit  func(t *testing.T, tree *envoyTree, pid int)
		order []string // log lines, in order
	}{
		{"clean", nil, func(t *testing.T, tree *envoyTree, _ int) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tree.admin.Quit(ctx); err != nil {
				t.Fatal(err)
			}
		}, []string{"Envoy exited normally", "Envoy exited cleanly: stopping agentd"}},
		{"crash", []string{"AGENTD_EXIT_ON_ENVOY_EXIT=true"}, func(t *testing.T, _ *envoyTree, pid int) {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}, []string{"Envoy exited with error", "stopping agentd, as Istio's agent does"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tree := startEnvoyTree(t, "", tt.env...)
			pids := childPids(t, tree.WaitReady())
			tt.exit(t, tree, pids["envoy"])
			if code := tree.Wait(); code != 0 {
				t.Errorf("agentd exited %d, want 0", code)
			}
			for name, pid := range pids {
				if alive(pid) {
					t.Errorf("%s (pid %d) outlived agentd", name, pid)
				}
			}
			if n := strings.Count(tree.Log.String(), "Envoy command"); n != 1 {
				t.Errorf("Envoy was started %d times, want once", n)
			}
			assertOrder(t, tree.Log.String(), tt.order...)
		})
	}
}
