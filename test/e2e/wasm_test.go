package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/agentd/agentd/internal/envoy"
	"github.com/agentd/agentd/internal/testing/ecdsclient"
	"github.com/agentd/agentd/internal/wasm/wasmtest"
)

// gate serves a module but holds every response half-sent until it is opened, so that a
// test can kill the fetching process mid-download.
type gate struct {
	module  []byte
	arrived chan struct{} // a request is holding
	open    chan struct{}
	once    sync.Once
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case <-g.open:
		w.Write(g.module)
		return
	default:
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(g.module)))
	w.Write(g.module[:len(g.module)/2])
	w.(http.Flusher).Flush()
	g.once.Do(func() { close(g.arrived) })
	select {
	case <-g.open:
		w.Write(g.module[len(g.module)/2:])
	case <-r.Context().Done():
	}
}

// TestWasmThroughAgentd: devplane sends a WasmPlugin for each case over ECDS; agentd's
// xds-proxy fetches from a real OCI registry and HTTP servers, and both Envoy (the stand-in
// where Envoy is not installed, which refuses remote code) and a grpc-go ADS client receive
// only local files under agentd's var/lib/istio/data, or Istio's RBAC fallback. xds-proxy killed with SIGKILL in the middle
// of a download loses nothing: the restarted one fetches again and leaves no partial file.
func TestWasmThroughAgentd(t *testing.T) {
	module := wasmtest.Module("e2e")
	srv := wasmtest.Start(t, module)
	held := append(wasmtest.Module("held"), make([]byte, 64<<10)...)
	g := &gate{module: held, arrived: make(chan struct{}), open: make(chan struct{})}
	gated := httptest.NewServer(g)
	t.Cleanup(gated.Close)
	t.Cleanup(func() { g.once.Do(func() {}); closeOnce(g.open) })

	local := filepath.Join(t.TempDir(), "local.wasm") // a module on the proxy's disk already
	if err := os.WriteFile(local, wasmtest.Module("local"), 0o644); err != nil {
		t.Fatal(err)
	}
	type wasmCase struct{ name, url, sha, policy, want string }
	cases := []wasmCase{
		{"oci-artifact", "oci://" + srv.Images[wasmtest.Artifact], srv.Digests[wasmtest.Artifact], "FAIL_CLOSE", "module"},
		{"oci-compat", "oci://" + srv.Images[wasmtest.Compat], "", "FAIL_CLOSE", "module"},
		{"http", srv.HTTP + "/plugin.wasm", wasmtest.SHA256(module), "FAIL_CLOSE", "module"},
		{"wrong-sha256", srv.HTTP + "/plugin.wasm", strings.Repeat("0", 64), "FAIL_CLOSE", "deny"},
		{"unreachable-open", "oci://127.0.0.1:1/wasm/none:v1", "", "FAIL_OPEN", "allow"},
		{"unreachable-close", "oci://127.0.0.1:1/wasm/none:v1", "", "FAIL_CLOSE", "deny"},
		{"local", "file://" + local, "", "FAIL_CLOSE", "file:" + local},
		{"held", gated.URL + "/held.wasm", wasmtest.SHA256(held), "FAIL_CLOSE", "held"},
	}
	var yaml strings.Builder
	yaml.WriteString("services:\n- hostname: reviews.default.svc.cluster.local\n  ports: [{port: 9080, protocol: HTTP}]\nwasmPlugins:\n")
	var names []string
	for _, c := range cases {
		fmt.Fprintf(&yaml, "- {name: %s, url: %q, sha256: %q, failStrategy: %s}\n", c.name, c.url, c.sha, c.policy)
		names = append(names, "extensions.istio.io/trafficextension/default."+c.name)
	}
	file := filepath.Join(t.TempDir(), "services.yaml")
	if err := os.WriteFile(file, []byte(yaml.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.%d.%d.%d:15010", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1)
	startDevplane(t, addr, file)
	// Envoy (the stand-in) as the sidecar runs it: its listeners fetch every plugin by ECDS.
	statusPort, adminPort := freePort(t), freePort(t)
	a := startAgentd(t, []string{"POD_NAME=app-1", "POD_NAMESPACE=default", "INSTANCE_IP=127.0.0.1",
		fmt.Sprintf(`PROXY_CONFIG={"controlPlaneAuthPolicy":"NONE","proxyAdminPort":%d}`, adminPort),
		"ENVOY_STATUS_PORT=" + strconv.Itoa(freePort(t)), "ENVOY_PROMETHEUS_PORT=" + strconv.Itoa(freePort(t))},
		"--discovery-address", addr, "--envoy-binary", envoyBinary(t), "--status-port", strconv.Itoa(statusPort))
	admin := envoy.NewAdmin("127.0.0.1", adminPort)
	waitChild(t, a, "xds-proxy", running)
	cacheDir := filepath.Join(a.Root, "var/lib/istio/data")

	// The first stream: xds-proxy is killed while the held module is half downloaded.
	first := subscribeECDS(t, a.Root, names)
	select {
	case <-g.arrived:
	case <-time.After(60 * time.Second):
		t.Fatal("xds-proxy never asked for the held module")
	}
	old := childPid(t, a, "xds-proxy")
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err == nil {
		t.Fatal("the client received ECDS from a proxy killed before its module was fetched")
	}
	waitFor(t, "the old xds-proxy to exit", func() bool { return !alive(old) })
	closeOnce(g.open)
	waitChild(t, a, "xds-proxy", running)

	// A new stream to the restarted xds-proxy receives every plugin converted.
	var resp *discoveryv3.DiscoveryResponse
	waitFor(t, "ECDS through the restarted xds-proxy", func() bool {
		s := subscribeECDS(t, a.Root, names)
		var err error
		resp, err = s.Recv()
		return err == nil
	})
	byName := map[string]string{}
	for _, r := range resp.GetResources() {
		name, what, err := ecdsclient.Loads(r)
		if err != nil {
			t.Fatal(err)
		}
		byName[name] = what
	}
	for i, c := range cases {
		got := byName[names[i]]
		want := c.want
		switch c.want {
		case "module", "held":
			b := module
			if c.want == "held" {
				b = held
			}
			p, ok := strings.CutPrefix(got, "file:")
			data, err := os.ReadFile(p)
			if !ok || !strings.HasPrefix(p, cacheDir+"/") || err != nil || string(data) != string(b) {
				t.Errorf("%s: the client loads %q (%v), want the whole module cached under %s", c.name, got, err, cacheDir)
			}
			continue
		}
		if got != want {
			t.Errorf("%s: the client loads %q, want %q", c.name, got, want)
		}
	}
	leftovers, _ := filepath.Glob(filepath.Join(cacheDir, "*", "*.tmp*"))
	if len(leftovers) != 0 {
		t.Errorf("partial files left in the cache: %v", leftovers)
	}

	// Envoy accepted the plugins from the restarted xds-proxy (the stand-in refuses remote
	// code and a filename that is not a Wasm module) and rejected nothing.
	stat := func(name string) uint64 {
		st, err := admin.Stats(context.Background(), "^"+strings.ReplaceAll(name, ".", `\.`)+"$")
		if err != nil || len(st) != 1 {
			return 0
		}
		v, _ := st[0].Uint()
		return v
	}
	waitFor(t, "Envoy to accept ECDS", func() bool { return stat("extension_config_discovery.update_success") > 0 })
	if n := stat("extension_config_discovery.update_rejected"); n != 0 {
		t.Errorf("Envoy rejected %d ECDS updates", n)
	}

	fams := scrapeMetrics(t, statusPort)
	for _, name := range []string{"istio_agent_wasm_cache_entries", "istio_agent_wasm_cache_lookup_count",
		"istio_agent_wasm_remote_fetch_count", "istio_agent_wasm_config_conversion_count", "istio_agent_wasm_config_conversion_duration"} {
		if fams[name] == nil {
			t.Errorf("merged metrics lack %s", name)
		}
	}
	if mf := fams["istio_agent_wasm_config_conversion_count"]; mf != nil {
		results := map[string]float64{}
		for _, m := range mf.GetMetric() {
			results[m.GetLabel()[0].GetValue()] += m.GetCounter().GetValue()
		}
		// On the restarted proxy, for each response converted (one per client stream): 4
		// modules fetched, 3 failed fetches, the local file.
		n := results["no_remote_load"]
		if n < 1 || results["success"] != 4*n || results["fetch_failure"] != 3*n || len(results) != 3 {
			t.Errorf("conversions by result = %v, want success 4n, fetch_failure 3n, no_remote_load n", results)
		}
	}
}

func closeOnce(c chan struct{}) {
	select {
	case <-c:
	default:
		close(c)
	}
}

// subscribeECDS opens an ADS stream to agentd's XDS socket as Envoy does and asks for names.
func subscribeECDS(t *testing.T, root string, names []string) *ecdsclient.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	s, err := ecdsclient.Subscribe(ctx, filepath.Join(root, "etc/istio/proxy/XDS"), "sidecar~127.0.0.1~app-1.default~default.svc.cluster.local", names)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
