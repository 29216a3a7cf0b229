package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/miekg/dns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/agentd/agentd/internal/caclient"
	"github.com/agentd/agentd/internal/supervisor"
	"github.com/agentd/agentd/internal/testing/devplane/devplanetest"
)

// The chaos test's clients follow the retry rules of the clients they stand for, and nothing
// more lenient:
const (
	// DNS: glibc's resolver defaults (resolv.conf `options timeout:5 attempts:2`): an attempt
	// waits 5 s for its answer on a new socket; a query is sent at most twice, and only a
	// timeout or a broken connection is retried. Any answer other than the right one fails.
	dnsAttemptTimeout = 5 * time.Second
	dnsAttempts       = 2
	// gRPC: one deadline of 5 s per call, at most 3 attempts, only UNAVAILABLE retried after
	// 100 ms (a gRPC retry policy with maxAttempts 3 and retryableStatusCodes [UNAVAILABLE]).
	rpcDeadline = 5 * time.Second
	rpcAttempts = 3
	// SDS: every (re)connection must hold a valid workload certificate within Envoy's default
	// initial_fetch_timeout, 15 s; a client reconnects at once when its stream breaks, as
	// Envoy does.
	sdsFetchTimeout = 15 * time.Second
)

// The supervisor's restart policy (internal/supervisor defaults): a child is in a crash loop
// after 5 exits in a row, each after a run shorter than 10 s, and then waits up to 30 s. The
// chaos kills a child at most maxStreak times in a row unless its current run is longer
// than the stable time: otherwise it would be testing that policy, not the tree's resilience.
const (
	maxStreak   = 4
	stableAfter = 11 * time.Second // 10 s and a margin
)

// TestChaos: devplane, agentd with the Envoy stand-in and every helper, and clients of every
// kind running the whole time (DNS queries for mesh and forwarded names, proxyless gRPC calls,
// SDS streams), while the test kills a random child with SIGKILL every few hundred
// milliseconds for chaosDuration, restarts devplane once, swaps dns-proxy for another
// binary, stops xds-proxy dead (SIGSTOP: hung, which agentd must find and replace) and floods
// the status port with idle connections, agentd being held to 512 file descriptors from the
// warm-up on (readiness and `agentd status` must answer meanwhile). At the end every DNS query
// got the right answer (over UDP at its first attempt: the queries a killed dns-proxy held
// are answered by the next one), every RPC and every SDS fetch succeeded under the rules above, every child runs and stays running, agentd holds no more
// file descriptors, threads or goroutines than after the warm-up, and SIGTERM ends the tree
// with exit status 0.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of chaos")
	}
	const chaosDuration = 35 * time.Second
	c := startChaosTree(t)

	dnsLoad := startDNSClients(c.dnsAddr, 3)
	rpcs := startRPCClients(c.cc, 2)
	sds := startSDSClients(t, c.sdsSocket, 2)

	// Warm-up: every child killed once, so that what agentd legitimately keeps (the Go
	// runtime's idle threads, grown to what concurrent restarts need) is in the baseline.
	for _, name := range c.children {
		c.kill(t, name)
		waitChild(t, c.Agentd, name, running)
	}
	c.waitSettled(t)
	base := c.stableResources(t)
	t.Logf("baseline after the warm-up: %s", base)
	limitFDs(t, c.Pid(), 512)

	// Chaos: a random child every 200-400 ms, devplane restarted at a third, dns-proxy
	// swapped at two thirds.
	start := time.Now()
	devplaneRestarted, swapped, hung, flooded := false, false, false, false
	for time.Since(start) < chaosDuration {
		time.Sleep(200*time.Millisecond + rand.N(200*time.Millisecond))
		switch elapsed := time.Since(start); {
		case !hung && elapsed > chaosDuration/8:
			hung = true
			c.hangAsync(t, "xds-proxy")
		case !flooded && elapsed > chaosDuration/2:
			flooded = true
			c.floodAsync(t)
		case !devplaneRestarted && elapsed > chaosDuration/3:
			devplaneRestarted = true
			go c.restartDevplane(t)
		case !swapped && elapsed > 2*chaosDuration/3:
			swapped = true
			c.swapAsync(t, "dns-proxy")
		}
		if name := c.pickVictim(t); name != "" {
			c.kill(t, name)
		}
	}
	c.swapWG.Wait()
	c.devWG.Wait()
	c.faultWG.Wait()
	// The probes' kept-alive connections are the test's, not agentd's to account for.
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	t.Logf("kills: %v", c.kills)
	if c.hung != 1 || c.floods != 1 {
		t.Errorf("hung children replaced: %d, status port floods survived: %d; want 1 each", c.hung, c.floods)
	}
	for _, name := range c.children {
		if c.kills[name] == 0 {
			t.Errorf("%s was never killed: the chaos did not reach it", name)
		}
	}

	// No child left crash-looping: all ready, and nothing restarts on its own afterwards.
	c.waitSettled(t)
	before := restartCounts(t, c.Agentd)
	time.Sleep(2 * time.Second)
	st, err := c.Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range st.Children {
		if ch.State != supervisor.Running || ch.Restarts != before[ch.Name] {
			t.Errorf("%s after the chaos: %s, restarts %d → %d; want running and no restart", ch.Name, ch.State, before[ch.Name], ch.Restarts)
		}
	}

	dnsLoad.check(t)
	// A TCP query dies with the connection of a killed dns-proxy and is retried; a UDP query
	// never is: those a killed process held are in agentd's memory, answered by the next.
	if n := dnsLoad.udpRetried.Load(); n > 0 {
		t.Errorf("%d DNS queries over UDP got no answer to their first attempt", n)
	}
	rpcs.check(t)
	sds.check(t)
	// One go-plugin socket directory per running helper: those of killed processes are gone.
	if dirs := pluginDirs(t, c.tmp); len(dirs) != len(c.children)-1 {
		t.Errorf("%d go-plugin socket directories in agentd's TMPDIR after the kills, want one per running helper: %v", len(dirs), dirs)
	}

	// agentd's resources are back to the baseline. The helpers' connections to agentd close
	// asynchronously after their processes die, so the count is polled for a while.
	var end chaosResources
	deadline := time.Now().Add(15 * time.Second)
	for {
		end = c.resources(t)
		if end.fitsIn(base) || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("after the chaos: %s", end)
	if !end.fitsIn(base) {
		t.Errorf("agentd's resources after the chaos: %s; baseline %s\nfds now:\n%s\nfds at the baseline:\n%s",
			end, base, strings.Join(end.fdTargets, "\n"), strings.Join(base.fdTargets, "\n"))
	}

	pids := childPids(t, st)
	c.Signal(syscall.SIGTERM)
	if code := c.Wait(); code != 0 {
		t.Errorf("agentd exited %d after SIGTERM, want 0", code)
	}
	for name, pid := range pids {
		if alive(pid) {
			t.Errorf("%s (pid %d) outlived agentd", name, pid)
		}
	}
	if dirs := pluginDirs(t, c.tmp); len(dirs) != 0 {
		t.Errorf("go-plugin socket directories left after agentd stopped: %v", dirs)
	}
}

// pluginDirs lists go-plugin's socket directories in dir.
func pluginDirs(t *testing.T, dir string) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(dir, "plugin-dir*"))
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// chaosTree is the system under chaos.
type chaosTree struct {
	*Agentd
	children   []string
	tmp        string // agentd's TMPDIR: go-plugin makes a socket directory there per helper process
	dnsAddr    string
	sdsSocket  string
	statusPort int
	cc         *grpc.ClientConn

	devMu       sync.Mutex
	dev         *devplaneProc
	devAddr     string
	devServices string
	devWG       sync.WaitGroup

	mu       sync.Mutex
	kills    map[string]int
	streak   map[string]int // kills in a row of runs shorter than stableAfter
	swapping string
	swapWG   sync.WaitGroup
	hanging  string // stopped dead, left to agentd to find
	hung     int    // hung children agentd replaced
	floods   int    // status port floods survived
	faultWG  sync.WaitGroup
}

func startChaosTree(t *testing.T) *chaosTree {
	t.Helper()
	upstream := startDnsmasq(t, "198.51.100.1 www.example.net\n")
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+upstream+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	backend := devplanetest.Backend(t)
	services := filepath.Join(t.TempDir(), "services.yaml")
	writeServices(t, services, backend)
	devAddr := fmt.Sprintf("127.%d.%d.%d:15010", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1)
	c := &chaosTree{
		children: []string{"prober", "sds-server", "xds-proxy", "dns-proxy", "envoy"},
		tmp:      t.TempDir(),
		dnsAddr:  freeDNSAddr(t), statusPort: freePort(t),
		dev: startDevplane(t, devAddr, services), devAddr: devAddr, devServices: services,
		kills: map[string]int{}, streak: map[string]int{},
	}
	c.Agentd = startAgentd(t, []string{
		"POD_NAME=app-1", "POD_NAMESPACE=default", "SERVICE_ACCOUNT=chaos", "INSTANCE_IP=127.0.0.1",
		"ISTIO_META_DNS_CAPTURE=true", "TMPDIR=" + c.tmp,
		fmt.Sprintf(`PROXY_CONFIG={"controlPlaneAuthPolicy":"NONE","proxyAdminPort":%d}`, freePort(t)),
		"ENVOY_STATUS_PORT=" + strconv.Itoa(freePort(t)), "ENVOY_PROMETHEUS_PORT=" + strconv.Itoa(freePort(t)),
	}, "--discovery-address", devAddr, "--envoy-binary", envoyBinary(t), "--dns-address", c.dnsAddr,
		"--resolv-conf", resolv, "--status-port", strconv.Itoa(c.statusPort), "--ready-timeout", "10s")
	c.sdsSocket = sdsSocket(c.Agentd)
	c.WaitReady()

	bootstrap, err := os.ReadFile(filepath.Join(c.Root, "etc/istio/proxy/grpc-bootstrap.json"))
	if err != nil {
		t.Fatalf("agentd wrote no gRPC bootstrap: %v", err)
	}
	c.cc = devplanetest.Dial(t, bootstrap, devplanetest.Target)
	devplanetest.WaitBackend(t, c.cc, backend)
	return c
}

// kill sends SIGKILL to the named child's current process, if it is agentd's child.
func (c *chaosTree) kill(t *testing.T, name string) {
	t.Helper()
	st, err := c.Status()
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	for _, ch := range st.Children {
		// The status may still show a process that just died: only a live child of agentd.
		if ch.Name != name || ch.Pid == 0 || !alive(ch.Pid) || parentPid(ch.Pid) != c.Pid() {
			continue
		}
		if err := syscall.Kill(ch.Pid, syscall.SIGKILL); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				continue
			}
			t.Fatalf("kill -9 %s (pid %d): %v", name, ch.Pid, err)
		}
		c.mu.Lock()
		c.kills[name]++
		if time.Since(ch.StartedAt) >= stableAfter {
			c.streak[name] = 0
		}
		c.streak[name]++
		c.mu.Unlock()
	}
}

// pickVictim returns a random running child that can be killed without pushing it into the
// supervisor's crash-loop policy, or "" when there is none now.
func (c *chaosTree) pickVictim(t *testing.T) string {
	t.Helper()
	st, err := c.Status()
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var ok []string
	for _, ch := range st.Children {
		if ch.State == supervisor.Running && ch.Name != c.swapping && ch.Name != c.hanging &&
			(c.streak[ch.Name] < maxStreak || time.Since(ch.StartedAt) >= stableAfter) {
			ok = append(ok, ch.Name)
		}
	}
	if len(ok) == 0 {
		return ""
	}
	return ok[rand.IntN(len(ok))]
}

// restartDevplane stops devplane for a second and starts it again on the same address.
func (c *chaosTree) restartDevplane(t *testing.T) {
	c.devWG.Add(1)
	defer c.devWG.Done()
	c.devMu.Lock()
	defer c.devMu.Unlock()
	c.dev.stop()
	time.Sleep(time.Second)
	c.dev = startDevplane(t, c.devAddr, c.devServices)
}

// swapAsync swaps the named helper for a copy of its binary, keeping the chaos off it meanwhile.
func (c *chaosTree) swapAsync(t *testing.T, name string) {
	data, err := os.ReadFile(bin(name))
	if err != nil {
		t.Fatal(err)
	}
	copyBin := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(copyBin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.swapping = name
	c.mu.Unlock()
	c.swapWG.Add(1)
	go func() {
		defer c.swapWG.Done()
		defer func() { c.mu.Lock(); c.swapping = ""; c.mu.Unlock() }()
		// The child may be restarting after a kill: a swap during the backoff is taken too,
		// but wait until it runs so that the swap replaces a serving process.
		deadline := time.Now().Add(30 * time.Second)
		for !childRunning(c.Agentd, name) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		out, err := c.CLI("swap", name, "--binary", copyBin, "--sha256", sha256Hex(data))
		if err != nil {
			t.Errorf("agentd swap %s during the chaos: %v\n%s", name, err, out)
			return
		}
		for _, ch := range mustStatus(t, c.Agentd) {
			if ch.Name == name && ch.Binary != copyBin {
				t.Errorf("after the swap %s runs %s, want %s", name, ch.Binary, copyBin)
			}
		}
	}()
}

// hangAsync stops the named child's process dead (SIGSTOP), keeping the chaos off it: agentd
// must answer readiness meanwhile (503, naming it) and replace it within a minute.
func (c *chaosTree) hangAsync(t *testing.T, name string) {
	c.mu.Lock()
	c.hanging = name
	c.mu.Unlock()
	c.faultWG.Add(1)
	go func() {
		defer c.faultWG.Done()
		defer func() { c.mu.Lock(); c.hanging = ""; c.mu.Unlock() }()
		deadline := time.Now().Add(30 * time.Second)
		for !childRunning(c.Agentd, name) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		var pid int
		for _, ch := range mustStatus(t, c.Agentd) {
			if ch.Name == name {
				pid = ch.Pid
			}
		}
		if pid == 0 || syscall.Kill(pid, syscall.SIGSTOP) != nil {
			t.Errorf("could not stop %s (pid %d) dead", name, pid)
			return
		}
		defer syscall.Kill(pid, syscall.SIGCONT) // if still there: let it die
		// Readiness answers (503, the hung child named) while it is hung.
		stopped := time.Now()
		probe := kubeletProbe{t: t, port: c.statusPort, what: name + " hung"}
		deadline = time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			probe.check()
			if alive(pid) {
				time.Sleep(time.Second)
				continue
			}
			t.Logf("%s stopped dead: replaced by agentd after %v", name, time.Since(stopped).Round(100*time.Millisecond))
			c.mu.Lock()
			c.hung++
			c.mu.Unlock()
			return
		}
		t.Errorf("%s (pid %d) hung for 60 s and still not replaced", name, pid)
	}()
}

// floodAsync opens 2000 idle connections to the status port, several times agentd's fd limit,
// for 5 s: readiness and `agentd status` answer meanwhile, and the kills go on.
func (c *chaosTree) floodAsync(t *testing.T) {
	c.faultWG.Add(1)
	go func() {
		defer c.faultWG.Done()
		end := floodStatusPort(t, c.statusPort, 2000)
		defer end()
		probe := kubeletProbe{t: t, port: c.statusPort, what: "the status port flooded"}
		until := time.Now().Add(5 * time.Second)
		for time.Now().Before(until) {
			probe.check()
			if _, err := c.Status(); err != nil {
				t.Errorf("agentd status during the status port flood: %v", err)
			}
			time.Sleep(500 * time.Millisecond)
		}
		c.mu.Lock()
		c.floods++
		c.mu.Unlock()
	}()
}

// kubeletProbe asks readiness as kubelet does, and fails the test as kubelet would mark the
// pod unready: after Istio's failureThreshold (4) probes in a row without an answer (the
// test probes far more often than Istio's 15 s period). An answer, 503 included, counts.
type kubeletProbe struct {
	t          *testing.T
	port       int
	what       string
	unanswered int
}

const kubeletFailureThreshold = 4

func (p *kubeletProbe) check() {
	code, body := statusGet(p.port, "/healthz/ready")
	if code != 0 {
		p.unanswered = 0
		return
	}
	if p.unanswered++; p.unanswered == kubeletFailureThreshold {
		p.t.Errorf("readiness with %s: %d probes in a row without an answer, the last: %s", p.what, p.unanswered, body)
	}
}

// waitSettled waits until agentd is ready with every child running.
func (c *chaosTree) waitSettled(t *testing.T) {
	t.Helper()
	// The same pids for half a second: a process killed a moment ago may still look alive
	// (exiting, not yet a zombie) and agentd not have seen it exit.
	var last map[string]int
	var since time.Time
	waitFor(t, "every child running and agentd ready", func() bool {
		st, err := c.Status()
		if err != nil || !st.Ready || len(st.Children) != len(c.children) {
			return false
		}
		for _, ch := range st.Children {
			// The status shows a killed process as running until agentd has seen it exit.
			if ch.State != supervisor.Running || !alive(ch.Pid) || parentPid(ch.Pid) != c.Pid() {
				return false
			}
		}
		if pids := childPids(t, st); !maps.Equal(pids, last) {
			last, since = pids, time.Now()
			return false
		}
		return time.Since(since) >= 500*time.Millisecond
	})
}

func childRunning(a *Agentd, name string) bool {
	st, err := a.Status()
	if err != nil {
		return false
	}
	for _, ch := range st.Children {
		if ch.Name == name {
			return ch.State == supervisor.Running
		}
	}
	return false
}

func mustStatus(t *testing.T, a *Agentd) []supervisor.Status {
	st, err := a.Status()
	if err != nil {
		t.Errorf("status: %v", err)
	}
	return st.Children
}

func restartCounts(t *testing.T, a *Agentd) map[string]int {
	out := map[string]int{}
	for _, ch := range mustStatus(t, a) {
		out[ch.Name] = ch.Restarts
	}
	return out
}

// parentPid is the parent of pid, or 0.
func parentPid(pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// chaosResources is what agentd holds: its file descriptors (by what they point at), its OS
// threads and its goroutines (agentd's own istio_agent_go_goroutines on its status port).
type chaosResources struct {
	fds, threads, goroutines int
	fdTargets                []string
}

func (r chaosResources) String() string {
	return fmt.Sprintf("%d fds, %d threads, %d goroutines", r.fds, r.threads, r.goroutines)
}

// fitsIn: no more file descriptors or goroutines than the baseline, and no more threads than
// the baseline and threadSlack. The Go runtime never ends an idle OS thread: it parks it for
// reuse, so agentd's thread count is the high-water mark of threads needed at once (one per
// goroutine in a blocking system call: process waits, accepts and reads during concurrent
// restarts). The warm-up reached that mark for one restart at a time; the chaos may overlap a
// restart with a swap and a devplane restart, hence a small slack. A leak per restart would
// add one thread for each of the chaos's dozens of kills.
func (r chaosResources) fitsIn(base chaosResources) bool {
	const threadSlack = 4
	return r.fds <= base.fds && r.goroutines <= base.goroutines && r.threads <= base.threads+threadSlack
}

// stableResources waits (bounded) until the pipes and process handles of the processes that
// just exited are closed: two readings half a second apart agree.
func (c *chaosTree) stableResources(t *testing.T) chaosResources {
	t.Helper()
	r := c.resources(t)
	for range 20 {
		time.Sleep(500 * time.Millisecond)
		next := c.resources(t)
		if next.fds == r.fds && next.goroutines == r.goroutines {
			return next
		}
		r = next
	}
	return r
}

func (c *chaosTree) resources(t *testing.T) chaosResources {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", c.Pid())
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var r chaosResources
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		r.fds++
		r.fdTargets = append(r.fdTargets, e.Name()+" -> "+target+socketEnds(c.Pid(), target))
	}
	slices.Sort(r.fdTargets)
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			r.threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	r.goroutines = c.goroutines(t)
	return r
}

// socketEnds describes a socket fd target ("socket:[inode]") by its TCP addresses or Unix
// path, from /proc/<pid>/net, for the failure message.
func socketEnds(pid int, target string) string {
	inode, ok := strings.CutPrefix(target, "socket:[")
	if !ok {
		return ""
	}
	inode = strings.TrimSuffix(inode, "]")
	for _, table := range []string{"tcp", "tcp6", "udp", "udp6", "unix"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			switch {
			case table == "unix" && len(f) >= 7 && f[6] == inode:
				return " unix " + strings.Join(f[7:], " ")
			case table != "unix" && len(f) >= 10 && f[9] == inode:
				return " " + table + " " + f[1] + " -> " + f[2] + " state " + f[3]
			}
		}
	}
	return ""
}

// goroutines reads agentd's istio_agent_go_goroutines from its merged metrics.
func (c *chaosTree) goroutines(t *testing.T) int {
	t.Helper()
	// No keep-alive: an idle connection of the test's own would be counted in agentd.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/stats/prometheus", c.statusPort))
	if err != nil {
		t.Fatalf("agentd's metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "istio_agent_go_goroutines "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("istio_agent_go_goroutines %q: %v", v, err)
			}
			return int(f)
		}
	}
	t.Fatalf("no istio_agent_go_goroutines in agentd's metrics (%v)", sc.Err())
	return 0
}

// clientLoad runs client goroutines until stopped and collects their failures.
type clientLoad struct {
	what string
	stop chan struct{}
	wg   sync.WaitGroup

	ops, retried atomic.Int64
	udpRetried   atomic.Int64 // DNS over UDP: queries agentd must never lose
	mu           sync.Mutex
	failures     []string
}

func newLoad(what string) *clientLoad { return &clientLoad{what: what, stop: make(chan struct{})} }

func (l *clientLoad) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

func (l *clientLoad) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures = append(l.failures, fmt.Sprintf(format, args...))
}

// check stops the clients and fails the test with what went wrong.
func (l *clientLoad) check(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	t.Logf("%s: %d done, %d needed a retry, %d failed", l.what, l.ops.Load(), l.retried.Load(), len(l.failures))
	if l.ops.Load() == 0 {
		t.Errorf("%s: nothing was done", l.what)
	}
	for i, f := range l.failures {
		if i == 20 {
			t.Errorf("%s: %d more failures", l.what, len(l.failures)-i)
			break
		}
		t.Errorf("%s: %s", l.what, f)
	}
}

// chaosQueries are the DNS queries and their only right answers: a mesh name from devplane's
// name table (through xds-proxy and the bus), its short name in the pod's namespace, and a
// name dns-proxy forwards to dnsmasq.
var chaosQueries = []struct {
	name, net, want string
}{
	{"reviews.default.svc.cluster.local.", "udp", "10.96.0.12"},
	{"reviews.", "udp", "10.96.0.12"},
	{"www.example.net.", "udp", "198.51.100.1"},
	{"reviews.default.svc.cluster.local.", "tcp", "10.96.0.12"},
	{"www.example.net.", "tcp", "198.51.100.1"},
}

func startDNSClients(addr string, n int) *clientLoad {
	l := newLoad("DNS queries")
	for range n {
		l.wg.Go(func() {
			for i := rand.IntN(len(chaosQueries)); !l.stopped(); i++ {
				q := chaosQueries[i%len(chaosQueries)]
				attempts, err := resolve(addr, q.name, q.net, q.want)
				l.ops.Add(1)
				if attempts > 1 {
					l.retried.Add(1)
					if q.net == "udp" {
						l.udpRetried.Add(1)
					}
				}
				if err != nil {
					l.fail("%s %s: %v", q.net, q.name, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	return l
}

// resolve asks for name's A record as glibc's resolver would (see dnsAttempts) and checks the
// answer is exactly want.
func resolve(addr, name, network, want string) (attempts int, err error) {
	for attempts = 1; ; attempts++ {
		c := &dns.Client{Net: network, Timeout: dnsAttemptTimeout}
		resp, _, err := c.Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), addr)
		if err != nil {
			if attempts < dnsAttempts {
				continue
			}
			return attempts, fmt.Errorf("no answer in %d attempts: %w", attempts, err)
		}
		var got []string
		for _, rr := range resp.Answer {
			if a, ok := rr.(*dns.A); ok {
				got = append(got, a.A.String())
			}
		}
		if resp.Rcode != dns.RcodeSuccess || !slices.Equal(got, []string{want}) {
			return attempts, fmt.Errorf("answer %s %v, want NOERROR [%s]", dns.RcodeToString[resp.Rcode], got, want)
		}
		return attempts, nil
	}
}

func startRPCClients(cc *grpc.ClientConn, n int) *clientLoad {
	l := newLoad("proxyless RPCs")
	for range n {
		l.wg.Go(func() {
			for !l.stopped() {
				attempts, err := callWithRetries(cc)
				l.ops.Add(1)
				if attempts > 1 {
					l.retried.Add(1)
				}
				if err != nil {
					l.fail("%v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	return l
}

// callWithRetries makes one call under the retry policy of rpcDeadline and rpcAttempts.
func callWithRetries(cc *grpc.ClientConn) (attempts int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), rpcDeadline)
	defer cancel()
	for attempts = 1; ; attempts++ {
		_, err = devplanetest.Call(ctx, cc)
		if err == nil || status.Code(err) != codes.Unavailable || attempts == rpcAttempts {
			if err != nil {
				err = fmt.Errorf("after %d attempts: %w", attempts, err)
			}
			return attempts, err
		}
		select {
		case <-ctx.Done():
			return attempts, fmt.Errorf("after %d attempts: %w", attempts, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startSDSClients opens n SDS clients on agentd's socket, each holding a stream for the
// workload certificate as Envoy does and reconnecting when it breaks.
func startSDSClients(t *testing.T, socket string, n int) *clientLoad {
	t.Helper()
	roots := x509.NewCertPool()
	for _, kv := range caEnv {
		if path, ok := strings.CutPrefix(kv, "CA_ROOT_CA="); ok {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			roots.AppendCertsFromPEM(data)
		}
	}
	want := caclient.SPIFFEID("cluster.local", "default", "chaos")
	l := newLoad("SDS fetches")
	for range n {
		conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		client := secretv3.NewSecretDiscoveryServiceClient(conn)
		l.wg.Go(func() {
			for !l.stopped() {
				streams, err := holdSDSStream(client, roots, want, l)
				l.ops.Add(1)
				if streams > 1 {
					l.retried.Add(1)
				}
				if err != nil {
					l.fail("%v", err)
				}
			}
		})
	}
	return l
}

// holdSDSStream fetches the default secret, retrying on new streams until it holds a valid
// one or sdsFetchTimeout passes, then keeps the stream open, checking each push, until it
// breaks or the load stops. It returns the number of streams the fetch took.
func holdSDSStream(client secretv3.SecretDiscoveryServiceClient, roots *x509.CertPool, want string, l *clientLoad) (streams int, err error) {
	fetchBy := time.Now().Add(sdsFetchTimeout)
	for streams = 1; ; streams++ {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-l.stop:
			case <-ctx.Done():
			}
			cancel()
		}()
		fetchCtx, fetchCancel := context.WithDeadline(ctx, fetchBy)
		stream, err := client.StreamSecrets(ctx, grpc.WaitForReady(true))
		var sec *tlsv3.Secret
		var resp *discoveryv3.DiscoveryResponse
		if err == nil {
			err = stream.Send(sdsRequest("", ""))
		}
		if err == nil {
			resp, sec, err = recvSecret(fetchCtx, stream)
		}
		fetchCancel()
		if err != nil {
			cancel()
			if l.stopped() {
				return streams, nil
			}
			if time.Now().After(fetchBy) {
				return streams, fmt.Errorf("no certificate within %v (%d streams): %w", sdsFetchTimeout, streams, err)
			}
			continue // the stream broke before the first secret: a new one, as Envoy
		}
		// Held: check this secret and every push until the stream breaks.
		for err == nil {
			if verr := verifySecret(sec, roots, want); verr != nil {
				cancel()
				return streams, verr
			}
			if err = stream.Send(sdsRequest(resp.GetVersionInfo(), resp.GetNonce())); err == nil {
				resp, sec, err = recvSecret(ctx, stream)
			}
		}
		cancel()
		return streams, nil
	}
}

func sdsRequest(version, nonce string) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{
		Node: &corev3.Node{Id: "sidecar~127.0.0.1~app-1.default~default.svc.cluster.local"}, TypeUrl: resourcev3.SecretType,
		ResourceNames: []string{"default"}, VersionInfo: version, ResponseNonce: nonce,
	}
}

// recvSecret receives the next response holding the default secret, or fails when ctx ends.
func recvSecret(ctx context.Context, stream secretv3.SecretDiscoveryService_StreamSecretsClient) (*discoveryv3.DiscoveryResponse, *tlsv3.Secret, error) {
	type result struct {
		resp *discoveryv3.DiscoveryResponse
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := stream.Recv()
		got <- result{resp, err}
	}()
	select {
	case r := <-got:
		if r.err != nil {
			return nil, nil, r.err
		}
		for _, a := range r.resp.GetResources() {
			sec := &tlsv3.Secret{}
			if err := a.UnmarshalTo(sec); err != nil {
				return nil, nil, fmt.Errorf("decode secret: %w", err)
			}
			if sec.GetName() == "default" {
				return r.resp, sec, nil
			}
		}
		return nil, nil, errors.New("a response without the default secret")
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// verifySecret checks a workload certificate: a key pair, chaining to the CA's roots, with
// the workload's SPIFFE identity, valid now.
func verifySecret(sec *tlsv3.Secret, roots *x509.CertPool, want string) error {
	tc := sec.GetTlsCertificate()
	pair, err := tls.X509KeyPair(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
	if err != nil {
		return fmt.Errorf("default is not a key pair: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("default does not chain to the CA: %w", err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		return fmt.Errorf("default's identity %v, want %s", leaf.URIs, want)
	}
	return nil
}
