package deploy

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// unit reads a systemd unit file into its settings, "Section.Key" to values in order.
func unit(t *testing.T, path string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: %q is not KEY=VALUE", path, line)
			}
			out[section+"."+k] = append(out[section+"."+k], v)
		}
	}
	return out
}

func TestServiceUnit(t *testing.T) {
	u := unit(t, "systemd/agentd.service")
	for key, want := range map[string]string{
		"Service.Type":         "notify", // agentd sends READY=1 (internal/notify)
		"Service.NotifyAccess": "main",
		"Service.Restart":      "on-failure",
		"Service.KillMode":     "mixed", // SIGTERM to agentd only; it stops its own tree
		"Service.KillSignal":   "SIGTERM",
		"Service.User":         "istio-proxy",
		"Service.ExecStart":    "/usr/local/lib/agentd/agentd proxy sidecar --root / --helpers-dir /usr/local/lib/agentd",
		"Install.WantedBy":     "multi-user.target",
	} {
		if got := u[key]; !slices.Equal(got, []string{want}) {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
	if got := u["Service.TimeoutStopSec"]; !slices.Equal(got, []string{"3min"}) {
		t.Errorf("TimeoutStopSec = %q, want 3min (above the default drain budget)", got)
	}
}

// TestSocketUnits checks that each socket unit hands agentd one socket, named as the child
// socket it replaces (see systemdSockets in internal/agent), at the address agentd would open.
func TestSocketUnits(t *testing.T) {
	want := map[string][2]string{
		"agentd-xds.socket":     {"xds", "ListenStream=/etc/istio/proxy/XDS"},
		"agentd-dns-udp.socket": {"dns-udp", "ListenDatagram=127.0.0.1:15053"},
		"agentd-dns-tcp.socket": {"dns-tcp", "ListenStream=127.0.0.1:15053"},
	}
	files, _ := filepath.Glob("systemd/*.socket")
	if len(files) != len(want) {
		t.Errorf("socket units %v, want %d", files, len(want))
	}
	for _, f := range files {
		w, ok := want[filepath.Base(f)]
		if !ok {
			t.Errorf("%s is not checked by this test: add it", f)
			continue
		}
		u := unit(t, f)
		if got := u["Socket.FileDescriptorName"]; !slices.Equal(got, []string{w[0]}) {
			t.Errorf("%s: FileDescriptorName = %q, want %q", f, got, w[0])
		}
		var listens []string
		for k, vs := range u {
			if strings.HasPrefix(k, "Socket.Listen") {
				for _, v := range vs {
					listens = append(listens, strings.TrimPrefix(k, "Socket.")+"="+v)
				}
			}
		}
		if !slices.Equal(listens, []string{w[1]}) {
			t.Errorf("%s: listens on %q, want exactly %q (FileDescriptorName names every socket of a unit)", f, listens, w[1])
		}
		if got := u["Socket.Service"]; !slices.Equal(got, []string{"agentd.service"}) {
			t.Errorf("%s: Service = %q, want agentd.service", f, got)
		}
	}
}

// TestUnitsVerify runs systemd's own checker on the units, where systemd is installed.
func TestUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	dir := t.TempDir()
	files, _ := filepath.Glob("systemd/*")
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// verify wants ExecStart's binary to exist: point it at one that does.
		data = bytes.ReplaceAll(data, []byte("ExecStart=/usr/local/lib/agentd/agentd"), []byte("ExecStart=/bin/true"))
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, filepath.Join(dir, filepath.Base(f)))
	}
	out, err := exec.Command(analyze, append([]string{"verify", "--man=no"}, names...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestInstallVMStaged runs scripts/install-vm.sh with DESTDIR and checks Istio's VM layout.
func TestInstallVMStaged(t *testing.T) {
	bin, files, dest := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "root")
	write(t, filepath.Join(bin, "agentd"), "#!/bin/sh\necho agentd\n", 0o755)
	onboarding := map[string]string{ // istioctl x workload entry configure's output → where Istio installs it
		"cluster.env":   "var/lib/istio/envoy/cluster.env",
		"mesh.yaml":     "etc/istio/config/mesh",
		"root-cert.pem": "etc/certs/root-cert.pem",
		"istio-token":   "var/run/secrets/tokens/istio-token",
	}
	for name := range onboarding {
		write(t, filepath.Join(files, name), "content of "+name, 0o644)
	}
	cmd := exec.Command("bash", "../scripts/install-vm.sh", "--bin", bin, "--files", files, "--sockets")
	cmd.Env = append(os.Environ(), "DESTDIR="+dest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install-vm.sh: %v\n%s", err, out)
	}
	for name, path := range onboarding {
		if got, err := os.ReadFile(filepath.Join(dest, path)); err != nil || string(got) != "content of "+name {
			t.Errorf("%s: %q, %v; want the content of %s", path, got, err, name)
		}
	}
	if fi, err := os.Stat(filepath.Join(dest, onboarding["istio-token"])); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("istio-token mode: %v, %v; want 0600", fi, err)
	}
	if link, err := os.Readlink(filepath.Join(dest, "usr/local/bin/agentd")); err != nil || link != "/usr/local/lib/agentd/agentd" {
		t.Errorf("usr/local/bin/agentd links to %q (%v), want /usr/local/lib/agentd/agentd", link, err)
	}
	for _, h := range []string{"xds-proxy", "sds-server", "dns-proxy", "prober"} { // agentd serves each by name
		if link, err := os.Readlink(filepath.Join(dest, "usr/local/lib/agentd", h)); err != nil || link != "agentd" {
			t.Errorf("usr/local/lib/agentd/%s links to %q (%v), want agentd", h, link, err)
		}
	}
	for _, p := range []string{"usr/local/lib/agentd/xds-proxy", "etc/systemd/system/agentd.service", "etc/systemd/system/agentd-xds.socket", "etc/istio/proxy", "var/lib/istio/data"} {
		if _, err := os.Stat(filepath.Join(dest, p)); err != nil {
			t.Errorf("not installed: %v", err)
		}
	}
}

func write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}
