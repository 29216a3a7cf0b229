package e2e

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/agentd/agentd/internal/agent"
)

// TestSocketModes: every Unix socket agentd opens under its root has the intended mode —
// the control and probe sockets owner-only (0600, as the control socket's directory), the
// XDS and SDS sockets 0666 as Istio's, so that Envoy and proxyless applications running as
// another user in the pod can connect — and there is no other. Each helper's own go-plugin
// socket (where agentd drives it: Configure, Drain) is reachable by its owner only.
func TestSocketModes(t *testing.T) {
	a := startAgentd(t, nil, "--disable-envoy")
	st := a.WaitReady()
	want := map[string]fs.FileMode{
		"var/run/agentd/control.sock":                0o600,
		"var/run/agentd/probe.sock":                  0o600,
		"etc/istio/proxy/XDS":                        0o666,
		"var/run/secrets/workload-spiffe-uds/socket": 0o666,
	}
	got := map[string]fs.FileMode{}
	filepath.WalkDir(a.Root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSocket != 0 {
			fi, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(a.Root, path)
			got[rel] = fi.Mode().Perm()
		}
		return nil
	})
	for path, mode := range want {
		if m, ok := got[path]; !ok || m != mode {
			t.Errorf("socket %s: mode %v (present %v), want %v", path, m, ok, mode)
		}
	}
	for path, mode := range got {
		if _, ok := want[path]; !ok {
			t.Errorf("unexpected socket %s (mode %v)", path, mode)
		}
	}
	if fi, err := os.Stat(filepath.Dir(agent.ControlSocket(a.Root))); err != nil || fi.Mode().Perm()&0o022 != 0 {
		t.Errorf("the control socket's directory: %v, mode %v; want writable by its owner only", err, fi.Mode().Perm())
	}

	for _, ch := range st.Children {
		for _, path := range listeningSockets(t, ch.Pid) {
			if strings.HasPrefix(path, a.Root+"/") {
				continue // agentd's own, checked above
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Errorf("%s listens on %s: %v", ch.Name, path, err)
				continue
			}
			dir, err := os.Stat(filepath.Dir(path))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm()&0o006 != 0 && dir.Mode().Perm()&0o005 != 0 {
				t.Errorf("%s's socket %s (mode %v, directory %v) is open to other users", ch.Name, path, fi.Mode().Perm(), dir.Mode().Perm())
			}
		}
	}
}

// listeningSockets returns the paths of the listening Unix sockets that pid holds.
func listeningSockets(t *testing.T, pid int) []string {
	t.Helper()
	inodes := map[string]bool{}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("fds of pid %d: %v", pid, err)
	}
	for _, e := range entries {
		target, _ := os.Readlink(filepath.Join(dir, e.Name()))
		if ino, ok := strings.CutPrefix(target, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	data, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, line := range strings.Split(string(data), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode Path; flags 00010000 is a listener.
		f := strings.Fields(line)
		if len(f) == 8 && f[3] == "00010000" && inodes[f[6]] && strings.HasPrefix(f[7], "/") {
			paths = append(paths, f[7])
		}
	}
	return paths
}

// TestNoPrivateKeyWritten: sds-server holds the workload key in memory only: after a client
// fetched its certificate there is no private key anywhere under agentd's root. With
// OUTPUT_CERTS (and no KUBERNETES_SERVICE_HOST, which makes Istio write them 0644) the key is
// written there, mode 0600, and nowhere else.
func TestNoPrivateKeyWritten(t *testing.T) {
	for _, output := range []bool{false, true} {
		t.Run(fmt.Sprintf("OUTPUT_CERTS=%v", output), func(t *testing.T) {
			env := []string{"POD_NAMESPACE=ns1", "SERVICE_ACCOUNT=sa1", "KUBERNETES_SERVICE_HOST="}
			if output {
				env = append(env, "OUTPUT_CERTS=etc/certs-out")
			}
			a := startAgentd(t, env, "--disable-envoy")
			a.WaitReady()
			def := openSDS(t, sdsSocket(a), "default")
			certFromSecret(t, def.next()) // the key exists now, in sds-server
			def.close()
			if output {
				waitFor(t, "OUTPUT_CERTS files", func() bool {
					_, err := os.Stat(filepath.Join(a.Root, "etc/certs-out/cert-chain.pem"))
					return err == nil
				})
			}
			var keys []string
			filepath.WalkDir(a.Root, func(path string, d fs.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return nil
				}
				data, err := os.ReadFile(path)
				if err == nil && bytes.Contains(data, []byte("PRIVATE KEY-----")) {
					rel, _ := filepath.Rel(a.Root, path)
					keys = append(keys, rel)
				}
				return nil
			})
			want := []string{}
			if output {
				want = []string{"etc/certs-out/key.pem"}
			}
			if !slices.Equal(keys, want) {
				t.Errorf("private keys under the root: %q, want %q", keys, want)
			}
			if output {
				fi, err := os.Stat(filepath.Join(a.Root, "etc/certs-out/key.pem"))
				if err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("OUTPUT_CERTS key.pem: %v, mode %v; want 0600", err, fi.Mode().Perm())
				}
			}
		})
	}
}

// TestProberStaysOnPod: app probes go to the pod's own address whatever they ask for. The
// kubelet probes name another host (an httpGet and a tcpSocket "host"), and the app answers
// one probe with a redirect to that host: the other host, a listener on another loopback
// address and the same port, is never reached, and the probes are answered by the app.
func TestProberStaysOnPod(t *testing.T) {
	const other = "127.0.0.2"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	elsewhere, err := net.Listen("tcp", net.JoinHostPort(other, strconv.Itoa(port)))
	if err != nil {
		t.Skipf("cannot listen on %s: %v", other, err)
	}
	var reached atomic.Int64
	go func() {
		for {
			c, err := elsewhere.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { elsewhere.Close() })
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ready":
			w.WriteHeader(http.StatusOK)
		case "/redirect":
			http.Redirect(w, r, fmt.Sprintf("http://%s:%d/ready", other, port), http.StatusFound)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	})}
	go app.Serve(l)
	t.Cleanup(func() { app.Close() })

	probers := fmt.Sprintf(`{
		"/app-health/app/readyz": {"httpGet": {"path": "/ready", "port": %[1]d, "host": %[2]q, "scheme": "HTTP"}, "timeoutSeconds": 2},
		"/app-health/app/livez": {"tcpSocket": {"port": %[1]d, "host": %[2]q}, "timeoutSeconds": 2},
		"/app-health/app/startupz": {"httpGet": {"path": "/redirect", "port": %[1]d, "scheme": "HTTP"}, "timeoutSeconds": 2}
	}`, port, other)
	statusPort := freePort(t)
	a := startAgentd(t, []string{"INSTANCE_IP=127.0.0.1", "ISTIO_KUBE_APP_PROBERS=" + probers},
		"--disable-envoy", "--status-port", strconv.Itoa(statusPort))
	a.WaitReady()
	for _, probe := range []string{"readyz", "livez", "startupz"} {
		url := fmt.Sprintf("http://127.0.0.1:%d/app-health/app/%s", statusPort, probe)
		if code := httpStatus("GET", url); code != http.StatusOK {
			t.Errorf("GET %s = %d, want 200 from the app on the pod's address", url, code)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the prober reached %s %d times; it must only reach the pod's own address", other, n)
	}
}

// TestControlSocketOtherUser: another user's `agentd status` is refused — first by the
// socket's mode, and, once the socket and its directories are opened to everyone (a chmod by
// mistake, or a socket passed on), by agentd's check of the peer's credentials. agentd's own
// user (root here) is still served.
func TestControlSocketOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	const nobody = 65534
	a := startAgentd(t, nil, "--disable-envoy")
	a.WaitReady()

	// A copy of agentd that user can execute.
	dir, err := os.MkdirTemp("", "agentd-other-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	client := filepath.Join(dir, "agentd")
	copyFile(t, bin("agentd"), client, 0o755)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	status := func(uid uint32) (string, error) {
		cmd := exec.Command(client, "status", "--root", a.Root)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	out, err := status(nobody)
	if err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("uid %d with the socket's own mode: %v %q, want permission denied", nobody, err, out)
	}

	// Open the socket and every directory above it to everyone.
	sock := agent.ControlSocket(a.Root)
	for p := filepath.Dir(sock); p != "/"; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o005 != 0o005 {
			if err := os.Chmod(p, fi.Mode().Perm()|0o005); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	out, err = status(nobody)
	t.Logf("uid %d on a socket open to all: %v %q", nobody, err, out)
	if err == nil || strings.Contains(out, "permission denied") || strings.Contains(out, "xds-proxy") {
		t.Errorf("uid %d on a socket open to all: %v %q, want refused by agentd (the connection closed), not by the mode", nobody, err, out)
	}
	if out, err := status(0); err != nil || !strings.Contains(out, "xds-proxy") {
		t.Errorf("root's agentd status: %v %q, want the children", err, out)
	}
}

// TestHelperEnvironment: each helper process gets only the environment it needs (the
// allow-list in internal/agent/helperenv.go), never agentd's secrets and Istio settings, which
// reach helpers in their typed configuration; the Go runtime's settings pass.
func TestHelperEnvironment(t *testing.T) {
	a := startAgentd(t, []string{"XDS_HEADER_Authorization=Bearer secret-token", "CA_HEADER_x-secret=secret-header",
		"AGENTD_TEST_SECRET=secret", "GOGC=77", "POD_NAMESPACE=ns1", "HTTPS_PROXY=http://127.0.0.1:3128"}, "--disable-envoy")
	st := a.WaitReady()
	// What agentd itself adds: the inherited sockets (LISTEN_*) and go-plugin's handshake
	// (its PLUGIN_* settings and agentd's magic cookie).
	added := func(k string) bool {
		return strings.HasPrefix(k, "LISTEN_") || strings.HasPrefix(k, "PLUGIN_") || k == "AGENTD_PLUGIN"
	}
	common := []string{"AGENTD_LOG_LEVEL", "GOGC", "GOMEMLIMIT", "GODEBUG", "GOMAXPROCS", "GOTRACEBACK", "TZ",
		"GRPC_GO_LOG_SEVERITY_LEVEL", "GRPC_GO_LOG_VERBOSITY_LEVEL", "GRPC_GO_LOG_FORMATTER"}
	upstream := []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR"}
	// xds-proxy reads Docker's keychain for Wasm images without a pull secret.
	allowed := map[string][]string{"xds-proxy": append(slices.Clone(upstream), "DOCKER_CONFIG", "HOME"), "sds-server": upstream}
	for _, ch := range st.Children {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", ch.Pid))
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		for _, kv := range strings.Split(strings.TrimRight(string(data), "\x00"), "\x00") {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
			if !added(k) && !slices.Contains(common, k) && !slices.Contains(allowed[ch.Name], k) {
				t.Errorf("%s's environment has %s", ch.Name, k)
			}
		}
		if env["GOGC"] != "77" {
			t.Errorf("%s's GOGC = %q, want agentd's 77", ch.Name, env["GOGC"])
		}
		if _, ok := env["HTTPS_PROXY"]; ok != slices.Contains(allowed[ch.Name], "HTTPS_PROXY") {
			t.Errorf("%s has HTTPS_PROXY: %v", ch.Name, ok)
		}
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
