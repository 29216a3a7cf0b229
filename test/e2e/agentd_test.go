package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentd/agentd/internal/control"
)

// helpers are the children of `agentd run --disable-envoy` with Istio's defaults and a pod's
// probe (podEnv): no dns-proxy, as Istio runs no DNS proxy unless ISTIO_META_DNS_CAPTURE or
// ISTIO_META_ENABLE_DNS_SERVER turns it on (TestRunStatusAndStop, dns_test.go).
var helpers = []string{"prober", "sds-server", "xds-proxy"}

func childPids(t *testing.T, st control.Status) map[string]int {
	t.Helper()
	pids := map[string]int{}
	for _, c := range st.Children {
		pids[c.Name] = c.Pid
	}
	return pids
}

// TestRunStatusAndStop: `agentd run --disable-envoy` with DNS capture on starts the four
// helpers, `agentd status --json` shows them running (and, once a name table came, ready)
// with exactly the documented fields, and SIGTERM ends every process of the tree with exit
// status 0.
func TestRunStatusAndStop(t *testing.T) {
	a := startAgentd(t, []string{"ISTIO_META_DNS_CAPTURE=true"}, "--disable-envoy")
	(&dnsAgent{Agentd: a}).publishTable(t, meshTable("10.0.0.1")) // what dns-proxy's readiness waits for
	a.WaitReady()
	all := append(slices.Clone(helpers), "dns-proxy")

	out, err := a.CLI("status", "--json")
	if err != nil {
		t.Fatalf("agentd status --json: %v\n%s", err, out)
	}
	var raw struct {
		Ready    bool             `json:"ready"`
		Children []map[string]any `json:"children"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, out)
	}
	var names []string
	for _, c := range raw.Children {
		keys := make([]string, 0, len(c))
		for k := range c {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if want := "binary,name,pid,restarts,sha256,started_at,state"; strings.Join(keys, ",") != want {
			t.Errorf("child fields = %v, want exactly %s", keys, want)
		}
		if c["state"] != "running" {
			t.Errorf("%v is %v, want running", c["name"], c["state"])
		}
		names = append(names, c["name"].(string))
	}
	if !raw.Ready || !slices.Equal(names, all) {
		t.Errorf("status = ready %v children %v, want ready with %v", raw.Ready, names, all)
	}
	table, err := a.CLI("status")
	if err != nil || !strings.Contains(table, "dns-proxy") || !strings.Contains(table, "running") {
		t.Errorf("agentd status table:\n%s (%v)", table, err)
	}

	st, _ := a.Status()
	pids := childPids(t, st)
	a.Signal(syscall.SIGTERM)
	if code := a.Wait(); code != 0 {
		t.Errorf("agentd exited %d after SIGTERM, want 0", code)
	}
	for name, pid := range pids {
		if alive(pid) {
			t.Errorf("%s (pid %d) outlived agentd", name, pid)
		}
	}
	if _, err := os.Stat(filepath.Join(a.Root, "etc/istio/proxy/XDS")); !os.IsNotExist(err) {
		t.Errorf("the XDS socket file is left after a clean stop (%v)", err)
	}
}

// TestNoProberWithoutProbes: with nothing to probe (no ISTIO_KUBE_APP_PROBERS, no
// readinessProbe) no prober runs, the tree is ready without it, and the status port answers a
// probe path as Istio's agent does for a path it has no prober for.
func TestNoProberWithoutProbes(t *testing.T) {
	port := freePort(t)
	a := startAgentd(t, []string{"ISTIO_KUBE_APP_PROBERS="}, "--disable-envoy", "--status-port", strconv.Itoa(port))
	var names []string
	for _, c := range a.WaitReady().Children {
		names = append(names, c.Name)
	}
	if want := []string{"sds-server", "xds-proxy"}; !slices.Equal(names, want) {
		t.Errorf("children = %v, want %v", names, want)
	}
	code, body := statusGet(port, "/app-health/app/livez")
	if want := "app prober config does not exists for /app-health/app/livez"; code != 400 || body != want {
		t.Errorf("GET /app-health/app/livez = %d %q, want 400 %q", code, body, want)
	}
	if out, err := a.CLI("restart", "prober"); err == nil {
		t.Errorf("agentd restart prober succeeded without a prober:\n%s", out)
	}
}

// TestChildrenDieWithAgentd: a kill -9 of agentd leaves no helper behind (parent-death signal).
func TestChildrenDieWithAgentd(t *testing.T) {
	a := startAgentd(t, nil, "--disable-envoy")
	pids := childPids(t, a.WaitReady())
	a.Signal(syscall.SIGKILL)
	a.Wait()
	waitFor(t, "helpers to die with agentd", func() bool {
		for _, pid := range pids {
			if alive(pid) {
				return false
			}
		}
		return true
	})
}

// TestSwapCommand: `agentd swap` refuses a wrong checksum and changes nothing, then swaps.
func TestSwapCommand(t *testing.T) {
	a := startAgentd(t, nil, "--disable-envoy")
	before := childPids(t, a.WaitReady())

	data, err := os.ReadFile(bin("prober"))
	if err != nil {
		t.Fatal(err)
	}
	patched := filepath.Join(t.TempDir(), "prober")
	if err := os.WriteFile(patched, data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := a.CLI("swap", "prober", "--binary", patched, "--sha256", strings.Repeat("ab", 32))
	if err == nil || !strings.Contains(out, "checksum") {
		t.Fatalf("swap with a wrong checksum: err %v, output %q; want a refusal naming the checksum", err, out)
	}
	if now := childPids(t, a.WaitReady()); now["prober"] != before["prober"] {
		t.Fatalf("a refused swap changed prober's pid %d → %d", before["prober"], now["prober"])
	}

	out, err = a.CLI("swap", "prober", "--binary", patched, "--sha256", sha256Hex(data))
	if err != nil {
		t.Fatalf("swap: %v\n%s", err, out)
	}
	st := a.WaitReady()
	for _, c := range st.Children {
		if c.Name == "prober" && (c.Binary != patched || c.Pid == before["prober"]) {
			t.Errorf("after swap prober = %+v, want a new pid running %s", c, patched)
		}
	}
	if alive(before["prober"]) {
		t.Errorf("the old prober (pid %d) still runs after the swap", before["prober"])
	}
}

// TestRestartCommand: `agentd restart NAME` replaces one child and leaves the others alone;
// an unknown name is an error.
func TestRestartCommand(t *testing.T) {
	a := startAgentd(t, nil, "--disable-envoy")
	before := childPids(t, a.WaitReady())
	if out, err := a.CLI("restart", "prober"); err != nil {
		t.Fatalf("agentd restart prober: %v\n%s", err, out)
	}
	after := childPids(t, a.WaitReady())
	for name, pid := range before {
		if changed := after[name] != pid; changed != (name == "prober") {
			t.Errorf("%s: pid %d → %d after restarting prober", name, pid, after[name])
		}
	}
	if out, err := a.CLI("restart", "nobody"); err == nil || !strings.Contains(out, "no such child") {
		t.Errorf("restart of an unknown child: %v %q, want an error", err, out)
	}
}
