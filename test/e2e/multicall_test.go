package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestHelpersAsLinksToAgentd: a helpers directory of links to agentd (prober -> agentd, ...)
// runs the whole tree from agentd's one executable file, each helper served by agentd's binary
// under the helper's name; one helper can still be swapped for its own binary.
func TestHelpersAsLinksToAgentd(t *testing.T) {
	dir := t.TempDir()
	for _, h := range helpers {
		if err := os.Symlink(bin("agentd"), filepath.Join(dir, h)); err != nil {
			t.Fatal(err)
		}
	}
	a := startAgentd(t, nil, "--disable-envoy", "--helpers-dir", dir) // the later --helpers-dir wins
	st := a.WaitReady()
	if len(st.Children) != len(helpers) {
		t.Fatalf("children %+v, want %v", st.Children, helpers)
	}
	for _, ch := range st.Children {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", ch.Pid)); err != nil || exe != bin("agentd") {
			t.Errorf("%s runs %q (%v), want agentd's binary %s", ch.Name, exe, err, bin("agentd"))
		}
	}
	if out, err := a.CLI("swap", "prober", "--binary", bin("prober")); err != nil {
		t.Fatalf("swap prober for its own binary: %v\n%s", err, out)
	}
	pid := childPid(t, a, "prober")
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe != bin("prober") {
		t.Errorf("after the swap prober runs %s, want %s", exe, bin("prober"))
	}
}
