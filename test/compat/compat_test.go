// Package compat compares agentd with Istio's own pilot-agent, on the outputs recorded from
// it in ../shared/reference/istio/cases (see its README): for each case, the real
// `agentd proxy sidecar` runs as the recording ran pilot-agent (a temp folder standing for
// the pod's /, the case's environment, devplane as the plaintext ADS server and CA on
// 127.0.0.1:15010) inside a private network namespace (Istio's fixed ports), with
// test/envoy-standin as Envoy (Envoy cannot be installed here) recording its argv and its -c
// file. Envoy's bootstrap, its command line and the gRPC bootstrap are compared as data with
// pilot-agent's, once with Istio's template in the root (rendered) and once without (agentd's
// own bootstrap). TestProbesAsPilotAgent replays the probes case's requests to the status
// port against a probe app (probeapp) and compares the answers and metric families.
package compat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/envoy/bootstrap"
	"github.com/agentd/agentd/test/compat/jsondiff"
)

// binDir holds agentd, its helpers, devplane and the Envoy stand-in, built once.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "agentd-compat-")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		build := exec.Command("go", "build", "-o", dir+"/", "../../cmd/...", "../envoy-standin")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build binaries: %v\n%s", err, out)
			return 1
		}
		binDir = dir
		return m.Run()
	}())
}

// reference is Istio's recorded outputs (AGENTD_ISTIO_REFERENCE overrides the default).
func reference(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("AGENTD_ISTIO_REFERENCE")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "reference", "istio")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(abs, "cases")); err != nil {
		t.Fatalf("Istio's recorded outputs: %v (set AGENTD_ISTIO_REFERENCE)", err)
	}
	return abs
}

// baseEnv is the environment of every recorded case (the reference README's), $STACK being
// the run's folder.
func baseEnv(stack string) []string {
	return []string{
		"POD_NAME=bench-0", "POD_NAMESPACE=default", "SERVICE_ACCOUNT=default", "INSTANCE_IP=127.0.0.1",
		"ISTIO_META_CLUSTER_ID=Kubernetes", "ISTIO_META_MESH_ID=cluster.local", "TRUST_DOMAIN=cluster.local",
		"CLOUD_PLATFORM=none", "ISTIO_META_DNS_CAPTURE=true", "DNS_PROXY_ADDR=127.0.0.1:15053",
		"PILOT_CERT_PROVIDER=istiod", "CA_ADDR=127.0.0.1:15010",
		`PROXY_CONFIG={"discoveryAddress":"127.0.0.1:15010","controlPlaneAuthPolicy":"NONE","binaryPath":"` + stack +
			`/envoy","statusPort":15020,"proxyAdminPort":15000}`,
	}
}

// outputs are what one run of agentd produced, normalised.
type outputs struct {
	bootstrap, grpcBootstrap map[string]any
	argv                     []string
	sideFiles                map[string]string // sideFiles present beside the bootstrap, by name
	envoyEnv                 []string          // what agentd added to or changed in Envoy's environment
	files                    []string          // what is under the root: path, kind, mode
}

// sideFiles are the files pilot-agent writes beside the bootstrap, in configPath, that a case
// records when pilot-agent wrote them.
var sideFiles = []string{bootstrap.LightstepTokenFile}

// run runs `agentd proxy sidecar` for the case in a private network namespace until the
// Envoy stand-in has recorded its start and the gRPC bootstrap is written, then stops it.
func run(t *testing.T, caseDir, template string) outputs {
	return runWith(t, caseDir, template, runOptions{})
}

// runOptions change a run: a template at another path, named by --templateFile or by the
// ProxyConfig's proxyBootstrapTemplatePath.
type runOptions struct {
	templateAt string // where the template is copied, relative to the run's folder
	flags      string // extra flags of agentd proxy sidecar
	env        []string
}

// agentRun is `agentd proxy sidecar` running for a case, in its private network namespace.
type agentRun struct {
	cmd                 *exec.Cmd
	done                chan error // cmd.Wait's result, once
	logFile             string
	stack, root, record string
}

// log is what agentd, its children and devplane have written so far.
func (r *agentRun) log() string {
	data, _ := os.ReadFile(r.logFile)
	return string(data)
}

// stop kills agentd's process group (its children have a parent-death signal; devplane is in
// the group) and waits for agentd.
func (r *agentRun) stop() {
	syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	err := <-r.done
	r.done <- err
}

// startAgent prepares the run's folder for the case as the recording had it and starts
// `agentd proxy sidecar` with the case's environment in a private network namespace; the run
// is stopped when the test ends.
func startAgent(t *testing.T, caseDir, template string, ro runOptions) *agentRun {
	t.Helper()
	stack, err := os.MkdirTemp("", "compat") // short: Unix socket paths are at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stack) })
	root := filepath.Join(stack, "root")
	record := filepath.Join(stack, "record")
	if _, err := os.Stat(filepath.Join(caseDir, "root")); err == nil {
		// Not the reference's modes (a read-only checkout): the recording's root was created
		// with the umask's.
		if out, err := exec.Command("cp", "-R", "--no-preserve=mode", filepath.Join(caseDir, "root"), root).CombinedOutput(); err != nil {
			t.Fatalf("copy the case's root: %v %s", err, out)
		}
	}
	for _, d := range []string{"etc/istio/proxy", "etc/istio/config", "var/lib/istio/envoy", "var/lib/istio/data",
		"var/run/secrets/istio", "var/run/secrets/tokens", "var/run/secrets/workload-spiffe-uds"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/run/secrets/tokens/istio-token"), []byte("token"), 0o644); err != nil {
		t.Fatal(err)
	}
	if template != "" {
		at := filepath.Join(root, bootstrap.DefaultTemplate)
		if ro.templateAt != "" {
			at = filepath.Join(stack, ro.templateAt)
		}
		if err := copyFile(template, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(stack, "services.yaml"), []byte("services: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(binDir, "envoy-standin"), filepath.Join(stack, "envoy")); err != nil {
		t.Fatal(err)
	}

	// The case's config.env is a shell fragment applied over the base environment.
	script := `set -e
ip link set lo up
"$BIN/devplane" -xds-address 127.0.0.1:15010 -debug-address "" -services "$STACK/services.yaml" -ca-root-out "$ROOT/var/run/secrets/istio/root-cert.pem" -log-level warn &
for i in $(seq 100); do [ -s "$ROOT/var/run/secrets/istio/root-cert.pem" ] && break; sleep 0.1; done
[ -s "$ROOT/var/run/secrets/istio/root-cert.pem" ] || { echo "devplane did not start" >&2; exit 1; }
set -a
. "$COMPAT_HERE/config.env"
set +a
cd "$ROOT"
env -0 >"$STACK/agent-environ"
exec "$BIN/agentd" proxy sidecar --root "$ROOT" --helpers-dir "$BIN" $FLAGS
`
	cmd := exec.Command("unshare", "-n", "--", "bash", "-c", script)
	cmd.Env = slices.Concat([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + stack}, baseEnv(stack), []string{
		"BIN=" + binDir, "ROOT=" + root, "STACK=" + stack, "STACK_ENVOY=" + filepath.Join(stack, "envoy"),
		"COMPAT_HERE=" + caseDir, "ENVOY_STANDIN_RECORD=" + record, "FLAGS=" + strings.ReplaceAll(ro.flags, "$STACK", stack),
	}, expandStack(ro.env, stack))
	// A file, not a pipe: cmd.Wait returns when agentd exits, whatever devplane holds open.
	logFile, err := os.Create(filepath.Join(stack, "agentd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &agentRun{cmd: cmd, done: make(chan error, 1), logFile: logFile.Name(), stack: stack, root: root, record: record}
	go func() { r.done <- cmd.Wait() }()
	t.Cleanup(r.stop)
	return r
}

func runWith(t *testing.T, caseDir, template string, ro runOptions) outputs {
	t.Helper()
	r := startAgent(t, caseDir, template, ro)
	root, record, stack := r.root, r.record, r.stack
	// What is compared is written at Envoy's start: the run is killed then.
	grpcFile := filepath.Join(root, "etc/istio/proxy/grpc-bootstrap.json")
	deadline := time.Now().Add(90 * time.Second)
	for !exists(filepath.Join(record, "bootstrap.json")) || !exists(filepath.Join(record, "envoy-argv.txt")) || !exists(grpcFile) {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("agentd exited (%v) before Envoy started:\n%s", err, r.log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("Envoy did not start within 90 s:\n%s", r.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the stand-in writes its three files one after the other
	r.stop()

	norm := strings.NewReplacer(root, "$ROOT", stack, "$STACK")
	var o outputs
	o.bootstrap = readJSON(t, filepath.Join(record, "bootstrap.json"), norm)
	o.grpcBootstrap = readJSON(t, grpcFile, norm)
	argv, err := os.ReadFile(filepath.Join(record, "envoy-argv.txt"))
	if err != nil {
		t.Fatal(err)
	}
	o.argv = strings.Fields(norm.Replace(string(argv)))
	o.envoyEnv = envAdded(t, filepath.Join(stack, "agent-environ"), filepath.Join(record, "envoy-environ"), norm)
	o.files = listFiles(t, root)
	o.sideFiles = map[string]string{}
	for _, name := range sideFiles {
		if data, err := os.ReadFile(filepath.Join(root, "etc/istio/proxy", name)); err == nil {
			o.sideFiles[name] = string(data)
		}
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("agentd's log:\n%s", r.log())
	}
	return o
}

// envAdded is what Envoy's environment (the stand-in's record) has that agentd's has not, or
// has with another value: "NAME=value" lines, sorted, as envoy-env.txt records them.
func envAdded(t *testing.T, agentFile, envoyFile string, norm *strings.Replacer) []string {
	t.Helper()
	read := func(path string) []string {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
	}
	agent := map[string]bool{}
	for _, kv := range read(agentFile) {
		agent[kv] = true
	}
	var added []string
	for _, kv := range read(envoyFile) {
		if !agent[kv] && !strings.HasPrefix(kv, "SHLVL=") { // the test's shell lowers SHLVL when it execs agentd
			added = append(added, norm.Replace(kv))
		}
	}
	slices.Sort(added)
	return added
}

// listFiles is what is under root, as files.txt records it: "path kind mode" (kind dir, file,
// socket or symlink; mode in octal), sorted by path.
func listFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		kind := "file"
		switch {
		case d.IsDir():
			kind = "dir"
		case info.Mode()&fs.ModeSocket != 0:
			kind = "socket"
		case info.Mode()&fs.ModeSymlink != 0:
			kind = "symlink"
		}
		rel, _ := filepath.Rel(root, path)
		out = append(out, fmt.Sprintf("%s %s %o", rel, kind, info.Mode().Perm()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// expandStack writes the run's folder for $STACK in env.
func expandStack(env []string, stack string) []string {
	out := make([]string, len(env))
	for i, kv := range env {
		out[i] = strings.ReplaceAll(kv, "$STACK", stack)
	}
	return out
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

// readJSON reads a bootstrap as data, normalised as the recordings are: the run's folders
// as $STACK and $ROOT, a non-empty ISTIO_VERSION as <version>.
func readJSON(t *testing.T, path string, norm *strings.Replacer) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	js, err := bootstrap.AsJSON(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(norm.Replace(string(js))), &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if node, ok := m["node"].(map[string]any); ok {
		if meta, ok := node["metadata"].(map[string]any); ok && meta["ISTIO_VERSION"] != "" && meta["ISTIO_VERSION"] != nil {
			meta["ISTIO_VERSION"] = "<version>"
		}
	}
	return m
}

// expected is a recorded file of the case, as data.
func expected(t *testing.T, caseDir, name string) map[string]any {
	t.Helper()
	return readJSON(t, filepath.Join(caseDir, name), strings.NewReplacer())
}

// intended are the differences from pilot-agent agentd has on purpose: a path prefix in the
// compared document, and why.
var intended = map[string]string{
	// grpc-bootstrap.json: pilot-agent writes its server URI from a relative path made
	// absolute against "/" (unix:///etc/istio/proxy/XDS); agentd writes the socket's real path
	// under its root, the same in a pod (root "/"). The test's normalisation writes the root
	// as $ROOT.
	"grpc .xds_servers[0].server_uri": "agentd names the XDS socket under its root (unix://$ROOT/etc/istio/proxy/XDS), pilot-agent relative to / (the same path in a pod)",
	"grpc .node.UserAgentVersionType": "a null field of Istio's Go struct, written by encoding/json; gRPC ignores it",
	// Istio encodes the keepalive's protobuf wrappers with encoding/json ({"value": 3});
	// protobuf's JSON, which Envoy reads, is the number.
	"bootstrap .static_resources.clusters[5].upstream_connection_options.tcp_keepalive": "keepalive values as protobuf JSON numbers, not Istio's wrapper objects",
}

// matches says whether the difference d of the document doc falls under one of the paths.
func matches(paths map[string]string, doc, d string) (string, bool) {
	full := doc + " " + d
	for p, why := range paths {
		if strings.HasPrefix(full, p+":") || strings.HasPrefix(full, p+" ") || strings.HasPrefix(full, p+".") {
			return why, true
		}
	}
	return "", false
}

// TestPilotAgentOutputs: for every recorded case (the reference's and testdata/cases), with
// Istio's template and with agentd's own bootstrap, Envoy's bootstrap, command line and
// environment (nothing added to agentd's, as pilot-agent adds nothing) and the gRPC bootstrap are
// pilot-agent's, and so is what is under the root once Envoy runs (files.txt), but for
// agentdFiles.
func TestPilotAgentOutputs(t *testing.T) {
	ref := reference(t)
	var dirs []string
	for _, folder := range []string{filepath.Join(ref, "cases"), filepath.Join("testdata", "cases")} {
		entries, err := os.ReadDir(folder)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			abs, err := filepath.Abs(filepath.Join(folder, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			dirs = append(dirs, abs)
		}
	}
	if len(dirs) < 8 {
		t.Fatalf("%d recorded cases; want the 5 of the reference and the 3 of testdata", len(dirs))
	}
	for _, caseDir := range dirs {
		for _, mode := range []struct{ name, template string }{
			{"template", filepath.Join(ref, "envoy_bootstrap_tmpl.json")},
			{"own", ""},
		} {
			t.Run(filepath.Base(caseDir)+"/"+mode.name, func(t *testing.T) {
				got := run(t, caseDir, mode.template)
				check := func(doc, file string, got map[string]any) {
					for _, d := range jsondiff.Diff("", got, expected(t, caseDir, file)) {
						if _, ok := matches(intended, doc, d); ok {
							continue
						}
						t.Errorf("%s: %s", file, d)
					}
				}
				check("bootstrap", "bootstrap.json", got.bootstrap)
				check("grpc", "grpc-bootstrap.json", got.grpcBootstrap)
				want, err := os.ReadFile(filepath.Join(caseDir, "envoy-argv.txt"))
				if err != nil {
					t.Fatal(err)
				}
				if w := strings.Fields(string(want)); !slices.Equal(got.argv, w) {
					t.Errorf("Envoy's argv:\n got %q\nwant %q", got.argv, w)
				}
				if w, ok := lines(t, filepath.Join(caseDir, "envoy-env.txt")); ok && !slices.Equal(got.envoyEnv, w) {
					t.Errorf("what agentd adds to Envoy's environment:\n got %q\nwant %q (envoy-env.txt)", got.envoyEnv, w)
				}
				if want, ok := lines(t, filepath.Join(caseDir, "files.txt")); ok {
					if mode.template == "" { // the test put no template there
						tmpl := strings.TrimPrefix(bootstrap.DefaultTemplate, "./") + " "
						want = slices.DeleteFunc(want, func(l string) bool { return strings.HasPrefix(l, tmpl) })
					}
					checkFiles(t, got.files, want)
				}
				for _, name := range sideFiles {
					want, err := os.ReadFile(filepath.Join(caseDir, name))
					if err != nil && !os.IsNotExist(err) {
						t.Fatal(err)
					}
					if g, ok := got.sideFiles[name]; ok != (err == nil) || g != string(want) {
						t.Errorf("%s beside the bootstrap: got %q (written: %v), want %q (written: %v)", name, g, ok, want, err == nil)
					}
				}
			})
		}
	}
}

// TestNamedTemplate: a template named by --templateFile or by the ProxyConfig's
// proxyBootstrapTemplatePath is rendered (Istio's, with one value changed so that the
// rendering shows; the path is in the metadata's PROXY_CONFIG as pilot-agent records it),
// where agentd used to refuse to start.
func TestNamedTemplate(t *testing.T) {
	ref := reference(t)
	caseDir := filepath.Join(ref, "cases", "plain")
	text, err := os.ReadFile(filepath.Join(ref, "envoy_bootstrap_tmpl.json"))
	if err != nil {
		t.Fatal(err)
	}
	const marker = "/var/lib/istio/data/custom-template.prof"
	custom := filepath.Join(t.TempDir(), "tmpl.json")
	if err := os.WriteFile(custom, bytes.Replace(text, []byte("/var/lib/istio/data/envoy.prof"), []byte(marker), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		ro   runOptions
	}{
		{"templateFile", runOptions{templateAt: "custom/tmpl.json", flags: "--templateFile $STACK/custom/tmpl.json"}},
		{"proxyBootstrapTemplatePath", runOptions{templateAt: "custom/tmpl.json", env: []string{
			`PROXY_CONFIG={"discoveryAddress":"127.0.0.1:15010","controlPlaneAuthPolicy":"NONE","binaryPath":"$STACK/envoy",` +
				`"statusPort":15020,"proxyAdminPort":15000,"proxyBootstrapTemplatePath":"$STACK/custom/tmpl.json"}`,
		}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := runWith(t, caseDir, custom, tt.ro)
			want := expected(t, caseDir, "bootstrap.json")
			want["admin"].(map[string]any)["profile_path"] = marker
			pc := want["node"].(map[string]any)["metadata"].(map[string]any)["PROXY_CONFIG"].(map[string]any)
			pc["proxyBootstrapTemplatePath"] = "$STACK/custom/tmpl.json"
			for _, d := range jsondiff.Diff("", got.bootstrap, want) {
				t.Errorf("bootstrap.json: %s", d)
			}
		})
	}
}

// lines are the non-empty lines of a recorded file, and whether the case records it.
func lines(t *testing.T, path string) ([]string, bool) {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out, true
}

// agentdFiles are what agentd creates under the root that pilot-agent does not, each with why.
var agentdFiles = map[string]string{
	"var/run/agentd":              "agentd's own runtime folder",
	"var/run/agentd/control.sock": "agentd's control socket: agentd status, restart, swap",
	"var/run/agentd/probe.sock":   "the socket on which the status server hands kubelet's connections to the prober",
}

// checkFiles: what is under the root is what pilot-agent left under its working directory
// (files.txt), but for agentdFiles.
func checkFiles(t *testing.T, got, want []string) {
	t.Helper()
	has := map[string]bool{}
	for _, g := range got {
		has[g] = true
	}
	for _, w := range want {
		if !has[w] {
			t.Errorf("files: pilot-agent's %q is not under agentd's root", w)
		}
		delete(has, w)
	}
	for _, g := range got {
		if has[g] {
			if _, ok := agentdFiles[strings.Fields(g)[0]]; !ok {
				t.Errorf("files: agentd's %q is not under pilot-agent's working directory", g)
			}
		}
	}
}
