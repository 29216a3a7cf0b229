package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/dnsproxy"
	"github.com/agentd/agentd/internal/supervisor"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// bigTable is a name table of n services (svcN.nsM.svc.cluster.local), about 80 bytes each.
func bigTable(n int) *ndsv1.NameTable {
	nt := &ndsv1.NameTable{Table: make(map[string]*ndsv1.NameTable_NameInfo, n)}
	for i := range n {
		ns := fmt.Sprintf("ns%d", i%10)
		nt.Table[fmt.Sprintf("svc%d.%s.svc.cluster.local", i, ns)] = svc(fmt.Sprintf("svc%d", i), ns,
			fmt.Sprintf("10.%d.%d.%d", 1+i/65536, i/256%256, i%256))
	}
	return nt
}

// TestOversizedNameTable: a name table over dns-proxy's limit (dnsproxy.MaxNameTableEntries)
// is refused: dns-proxy keeps serving the table it had, and keeps running.
func TestOversizedNameTable(t *testing.T) {
	a := startDNSAgent(t)
	a.publishTable(t, meshTable("10.0.0.1"))
	pid := a.dnsProxy(t, "dns-proxy ready", serving).Pid
	a.publishTable(t, bigTable(dnsproxy.MaxNameTableEntries+1))
	waitFor(t, "dns-proxy to refuse the oversized table", func() bool {
		return strings.Contains(a.Log.String(), "name table refused")
	})
	if r := dig(t, a.addr, "details", "A"); !slices.Equal(r.answers, []string{"details. a 10.0.0.1"}) {
		t.Errorf("after an oversized table: %q, want the previous table's answer\n%s", r.answers, r.raw)
	}
	if now := a.dnsProxy(t, "dns-proxy", func(s supervisor.Status) bool { return true }).Pid; now != pid {
		t.Errorf("dns-proxy restarted (pid %d → %d) on an oversized table", pid, now)
	}
}

// TestBrokenHelperBinary: `agentd run` with one helper binary that cannot serve — a corrupt
// executable, a file that is not executable, a program that is not a plugin — starts the
// other helpers, which keep serving, and shows the broken one in a crash loop.
func TestBrokenHelperBinary(t *testing.T) {
	tests := []struct {
		name, helper string
		content      string
		mode         os.FileMode
	}{
		{"corrupt executable", "sds-server", "\x7fELF\x02\x01\x01garbage", 0o755},
		{"not executable", "xds-proxy", "#!/bin/sh\nexit 0\n", 0o644},
		{"not a plugin", "prober", "#!/bin/sh\necho hello\nexit 0\n", 0o755},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, h := range helpers {
				path := filepath.Join(dir, h)
				if h == tt.helper {
					if err := os.WriteFile(path, []byte(tt.content), tt.mode); err != nil {
						t.Fatal(err)
					}
				} else if err := os.Symlink(bin(h), path); err != nil {
					t.Fatal(err)
				}
			}
			a := startAgentd(t, nil, "--disable-envoy", "--helpers-dir", dir, "--ready-timeout", "5s")
			waitChild(t, a, tt.helper, func(s supervisor.Status) bool { return s.State == supervisor.CrashLoop })
			st, err := a.Status()
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range helpers {
				if h != tt.helper {
					waitChild(t, a, h, running)
				}
			}
			if st.Ready {
				t.Errorf("agentd ready with %s in a crash loop", tt.helper)
			}
			out, err := a.CLI("status")
			if err != nil || !strings.Contains(out, "crashloop") {
				t.Errorf("agentd status: %v\n%s\nwant %s shown in crashloop", err, out, tt.helper)
			}
		})
	}
}

// TestConfigThatDoesNotParse: `agentd run` with a proxy or probe configuration that does not
// parse (what Istio's agent refuses too) stops at once with exit status 1, a message naming the
// setting, and no process left.
func TestConfigThatDoesNotParse(t *testing.T) {
	tests := []struct {
		env, want string
	}{
		{`PROXY_CONFIG={"discoveryAddress": `, "PROXY_CONFIG"},
		{"PROXY_CONFIG=concurrency: [not a number", "PROXY_CONFIG"},
		{`ISTIO_KUBE_APP_PROBERS={"/app-health/a/livez":`, "ISTIO_KUBE_APP_PROBERS"},
		{`ISTIO_KUBE_APP_PROBERS={"/app-health/a/livez":{"httpGet":{"port":"http"}}}`, "ISTIO_KUBE_APP_PROBERS"},
		// Every CSR would fail (Istio's too): refused at agentd's start, not in sds-server.
		{"ECC_SIGNATURE_ALGORITHM=ED25519", "ECC_SIGNATURE_ALGORITHM"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin("agentd"), "run", "--root", t.TempDir(), "--helpers-dir", binDir,
				"--disable-envoy", "--dns-address", "127.0.0.1:0", "--status-port", strconv.Itoa(freePort(t)))
			cmd.Env = append(append(os.Environ(), caEnv...), tt.env)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			out, err := cmd.CombinedOutput()
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // nothing should be left; if it is, it goes
			if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), tt.want) {
				t.Errorf("agentd run with %s: exit %d (%v), want 1 and a message naming %s:\n%s", tt.env, code, err, tt.want, out)
			}
		})
	}
}

// TestConfigIstioWarnsAbout: a value Istio's agent warns about and replaces by its default
// does not stop agentd either: it is logged, naming the variable, and the tree becomes ready
// (a typo must not crash-loop a pod Istio would run).
func TestConfigIstioWarnsAbout(t *testing.T) {
	for _, env := range []string{"DNS_FORWARD_TIMEOUT=soon", "SECRET_TTL=-1h", "ISTIO_DELTA_XDS=maybe", "ENVOY_STATUS_PORT=abc", "ECC_CURVE=P999"} {
		name, _, _ := strings.Cut(env, "=")
		t.Run(name, func(t *testing.T) {
			a := startAgentd(t, []string{env}, "--disable-envoy")
			a.WaitReady()
			if log := a.Log.String(); !strings.Contains(log, "invalid environment variable") || !strings.Contains(log, name) {
				t.Errorf("agentd with %s: no warning naming %s", env, name)
			}
		})
	}
}

// TestProxyStartErrorExits255: `agentd proxy` that cannot start exits 255, pilot-agent's
// status on an error.
func TestProxyStartErrorExits255(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin("agentd"), "proxy", "sidecar", "--root", t.TempDir(), "--helpers-dir", binDir)
	cmd.Env = append(os.Environ(), `PROXY_CONFIG={"discoveryAddress": `, "DISABLE_ENVOY=true")
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 255 || !strings.Contains(string(out), "PROXY_CONFIG") {
		t.Errorf("agentd proxy with a PROXY_CONFIG that does not parse: exit %d, want 255 and a message naming it:\n%s", code, out)
	}
}

// TestTaskFailureStopsAgentd: a task of agentd that cannot run (here the control socket, whose
// path under a too long root does not fit a Unix socket address) stops agentd with an error
// naming it, the children with it, instead of leaving the other tasks running.
func TestTaskFailureStopsAgentd(t *testing.T) {
	root := filepath.Join(t.TempDir(), strings.Repeat("r", 100))
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin("agentd"), "run", "--root", root, "--helpers-dir", binDir,
		"--disable-envoy", "--dns-address", "127.0.0.1:0", "--status-port", strconv.Itoa(freePort(t)))
	cmd.Env = append(os.Environ(), caEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.CombinedOutput()
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if ctx.Err() != nil || err == nil || !strings.Contains(string(out), "control") {
		t.Errorf("agentd with a control socket path too long: %v (deadline: %v), want a prompt exit naming the control socket:\n%s", err, ctx.Err(), out)
	}
}
