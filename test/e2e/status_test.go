package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testing/logbuf"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// probeApp is the workload: /ok answers 200 "app ok" or 500 while unhealthy; it records the
// source address of the last request.
type probeApp struct {
	port      int
	unhealthy atomic.Bool
	lastFrom  atomic.Value
}

func startProbeApp(t *testing.T) *probeApp {
	t.Helper()
	a := &probeApp{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.lastFrom.Store(r.RemoteAddr)
		if a.unhealthy.Load() {
			w.WriteHeader(http.StatusInternalServerError)
		}
		fmt.Fprint(w, "app ok")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	a.port = l.Addr().(*net.TCPAddr).Port
	return a
}

func (a *probeApp) probersEnv() string {
	return fmt.Sprintf(`ISTIO_KUBE_APP_PROBERS={"/app-health/app/readyz":{"httpGet":{"path":"/ok","port":%d},"timeoutSeconds":2}}`, a.port)
}

// statusGet GETs the status port; a refused or failed request is code 0.
func statusGet(port int, path string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(port) + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func waitStatus(t *testing.T, port int, path string, want int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s to answer %d", path, want), func() bool {
		code, _ := statusGet(port, path)
		return code == want
	})
}

// TestStatusServerFollowsTree: `agentd run --disable-envoy` with DNS capture on. Readiness is
// 503 while the tree comes up, naming the child it waits for (dns-proxy, until a name table
// arrives; agentd wait times out meanwhile), and 200 once the table is there (agentd wait
// returns); app probes, /debug/ndsz and the merged metrics answer;
// a killed helper turns readiness 503 with its name until it is back; /quitquitquit stops
// agentd.
func TestStatusServerFollowsTree(t *testing.T) {
	app := startProbeApp(t)
	port := freePort(t)
	a := startAgentd(t, []string{"ISTIO_META_DNS_CAPTURE=true", "INSTANCE_IP=127.0.0.1", app.probersEnv()},
		"--disable-envoy", "--ready-timeout", "60s", "--status-port", strconv.Itoa(port), "--discovery-address", "127.0.0.1:"+strconv.Itoa(freePort(t)))
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/healthz/ready"

	// The status port opens before the children start; nothing can be ready without a table.
	if code, body := statusGet(port, "/healthz/ready"); code != 503 {
		t.Fatalf("first /healthz/ready = %d %q, want 503", code, body)
	}
	// The tree comes up in order; dns-proxy runs but is not ready until a name table comes.
	// (Its brief "starting" state is a window a loaded machine's poll can miss: not asserted.)
	waitFor(t, "readiness to name dns-proxy", func() bool {
		statusGet(port, "/healthz/ready")
		return strings.Contains(a.Log.String(), "Envoy proxy is NOT ready: dns-proxy is not ready")
	})
	outb, err := exec.Command(bin("agentd"), "wait", "--url", url, "--timeout", "1s", "--periodMillis", "100").CombinedOutput()
	if out := string(outb); err == nil || !strings.Contains(out, "Last error: HTTP status code 503") {
		t.Errorf("agentd wait before the name table: err %v, output %q; want a timeout with the 503", err, outb)
	}
	if code, body := statusGet(port, "/debug/ndsz"); code != 404 || body != "{}" {
		t.Errorf("/debug/ndsz before a table = %d %q, want 404 {}", code, body)
	}

	waiter := exec.Command(bin("agentd"), "wait", "--url", url, "--timeoutSeconds", "60", "--periodMillis", "50")
	waitOut := &logbuf.Buffer{}
	waiter.Stdout, waiter.Stderr = waitOut, waitOut
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	(&dnsAgent{Agentd: a}).publishTable(t, meshTable("10.0.0.1"))
	if err := waiter.Wait(); err != nil {
		t.Errorf("agentd wait once ready: %v\n%s", err, waitOut)
	}
	if code, _ := statusGet(port, "/healthz/ready"); code != 200 {
		t.Errorf("/healthz/ready after the table = %d, want 200", code)
	}

	t.Run("app probe", func(t *testing.T) {
		if code, body := statusGet(port, "/app-health/app/readyz"); code != 200 || body != "app ok" {
			t.Errorf("/app-health/app/readyz = %d %q, want 200 \"app ok\"", code, body)
		}
		if from, _ := app.lastFrom.Load().(string); !strings.HasPrefix(from, "127.0.0.6:") {
			t.Errorf("the app saw the probe from %q, want 127.0.0.6", from)
		}
		if code, body := statusGet(port, "/app-health/other/livez"); code != 400 || body != "app prober config does not exists for /app-health/other/livez" {
			t.Errorf("unknown probe path = %d %q", code, body)
		}
	})
	t.Run("ndsz", func(t *testing.T) {
		if code, body := statusGet(port, "/debug/ndsz"); code != 200 || !strings.Contains(body, "details.ns1.svc.cluster.local") {
			t.Errorf("/debug/ndsz = %d %.200s, want the published table", code, body)
		}
	})
	t.Run("merged metrics", func(t *testing.T) {
		fams := scrapeMetrics(t, port)
		for _, name := range []string{"istio_agent_scrapes_total", "istio_agent_go_goroutines", "agentd_app_probes_total"} {
			if fams[name] == nil {
				t.Errorf("merged metrics lack %s", name)
			}
		}
		// Set at the first readiness, as Istio's agent sets it.
		if f := fams["istio_agent_startup_duration_seconds"]; f == nil || f.GetMetric()[0].GetGauge().GetValue() <= 0 {
			t.Errorf("istio_agent_startup_duration_seconds = %v, want the time to the first readiness", f)
		}
	})

	before := childPids(t, a.WaitReady())
	if err := syscall.Kill(before["dns-proxy"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The restart is quick (a stable child restarts at once): poll without pausing.
	logBefore := len(a.Log.String())
	deadline := time.Now().Add(30 * time.Second)
	for code := 0; code != 503; code, _ = statusGet(port, "/healthz/ready") {
		if time.Now().After(deadline) {
			t.Fatal("readiness did not fail after dns-proxy was killed")
		}
	}
	waitFor(t, "the log to name dns-proxy", func() bool {
		return strings.Contains(a.Log.String()[logBefore:], "Envoy proxy is NOT ready: dns-proxy")
	})
	waitStatus(t, port, "/healthz/ready", 200) // restarted, with the retained table

	resp, err := http.Post("http://127.0.0.1:"+strconv.Itoa(port)+"/quitquitquit", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("POST /quitquitquit = %d, want 200", resp.StatusCode)
	}
	if code := a.Wait(); code != 0 {
		t.Errorf("agentd exited %d after /quitquitquit, want 0", code)
	}
}

func scrapeMetrics(t *testing.T, port int) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/stats/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := expfmt.NewDecoder(resp.Body, expfmt.ResponseFormat(resp.Header))
	fams := map[string]*dto.MetricFamily{}
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); errors.Is(err, io.EOF) {
			return fams
		} else if err != nil {
			t.Fatalf("merged metrics do not parse: %v", err)
		}
		fams[mf.GetName()] = mf
	}
}

// healthDevplane runs devplane (xDS, CA and the debug server that shows health reports) for
// an Envoy tree, and returns agentd's environment for it and the debug address.
func healthDevplane(t *testing.T) (env []string, xdsAddr, debugAddr string) {
	t.Helper()
	dir := t.TempDir()
	services := filepath.Join(dir, "services.yaml")
	if err := os.WriteFile(services, []byte("services: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "ca-root.pem")
	caAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	xdsAddr = "127.0.0.1:" + strconv.Itoa(freePort(t))
	debugAddr = "127.0.0.1:" + strconv.Itoa(freePort(t))
	cmd := exec.Command(bin("devplane"), "--services", services, "--xds-address", xdsAddr, "--debug-address", debugAddr,
		"--ca-address", caAddr, "--ca-root-out", root)
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("devplane output:\n%s", out)
		}
	})
	waitFor(t, "devplane's CA root", func() bool { _, err := os.Stat(root); return err == nil })
	return []string{"CA_ADDR=" + caAddr, "CA_ROOT_CA=" + root, "ECC_SIGNATURE_ALGORITHM=ECDSA"}, xdsAddr, debugAddr
}

// devplaneHealth is devplane's last health report of the one client that sent one.
func devplaneHealth(debugAddr string) (healthy bool, message string, ok bool) {
	resp, err := http.Get("http://" + debugAddr + "/debug/health")
	if err != nil {
		return false, "", false
	}
	defer resp.Body.Close()
	var reports map[string]struct {
		Healthy bool   `json:"healthy"`
		Message string `json:"message"`
	}
	if json.NewDecoder(resp.Body).Decode(&reports) != nil || len(reports) != 1 {
		return false, "", false
	}
	for _, r := range reports {
		return r.Healthy, r.Message, true
	}
	return false, "", false
}

// TestStatusWithEnvoy: with Envoy (the stand-in unless a real one is on PATH) and devplane.
// ProxyConfig's readinessProbe flips with the app, and devplane records each flip that xds-proxy
// reports. On SIGTERM readiness is 503 at once, while app probes still answer during Envoy's
// drain (Istio closes its status port instead).
func TestStatusWithEnvoy(t *testing.T) {
	app := startProbeApp(t)
	env, xdsAddr, debugAddr := healthDevplane(t)
	adminPort, port := freePort(t), freePort(t)
	pc := fmt.Sprintf(`{"controlPlaneAuthPolicy":"NONE","proxyAdminPort":%d,"terminationDrainDuration":"3s",`+
		`"readinessProbe":{"httpGet":{"path":"/ok","port":%d},"periodSeconds":1}}`, adminPort, app.port)
	env = append(env, "POD_NAME=app-1", "POD_NAMESPACE=ns", "SERVICE_ACCOUNT=sa", "INSTANCE_IP=127.0.0.1",
		"PROXY_CONFIG="+pc, app.probersEnv(),
		"ENVOY_STATUS_PORT="+strconv.Itoa(freePort(t)), "ENVOY_PROMETHEUS_PORT="+strconv.Itoa(freePort(t)))
	a := startAgentd(t, env, "--discovery-address", xdsAddr, "--envoy-binary", envoyBinary(t), "--status-port", strconv.Itoa(port))
	a.WaitReady()
	waitStatus(t, port, "/healthz/ready", 200)

	flips := []struct {
		unhealthy bool
		message   string
	}{{false, ""}, {true, "bad code 500"}, {false, ""}}
	for _, f := range flips {
		app.unhealthy.Store(f.unhealthy)
		waitFor(t, fmt.Sprintf("devplane to see healthy=%v", !f.unhealthy), func() bool {
			healthy, msg, ok := devplaneHealth(debugAddr)
			return ok && healthy == !f.unhealthy && strings.Contains(msg, f.message)
		})
	}

	a.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(2 * time.Second)
	for {
		code, _ := statusGet(port, "/healthz/ready")
		if code == 503 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz/ready = %d 2s after SIGTERM, want 503", code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := statusGet(port, "/app-health/app/readyz"); code != 200 || body != "app ok" {
		t.Errorf("app probe during the drain = %d %q, want 200 \"app ok\"", code, body)
	}
	if code := a.Wait(); code != 0 {
		t.Errorf("agentd exited %d after SIGTERM, want 0", code)
	}
	if !strings.Contains(a.Log.String(), "Envoy proxy is NOT ready: server is terminated") {
		t.Errorf("agentd's log lacks \"server is terminated\"")
	}
}
