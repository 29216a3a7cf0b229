package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testing/logbuf"

	"google.golang.org/grpc"

	"github.com/agentd/agentd/internal/supervisor"
	"github.com/agentd/agentd/internal/testing/devplane/devplanetest"
)

// devplaneProc is a devplane process serving a services file.
type devplaneProc struct {
	addr, file string
	cmd        *exec.Cmd
	done       chan struct{}
	log        *logbuf.Buffer
}

// startDevplane runs devplane on addr with the services file.
func startDevplane(t *testing.T, addr, file string) *devplaneProc {
	t.Helper()
	d := &devplaneProc{addr: addr, file: file, done: make(chan struct{}), log: &logbuf.Buffer{}}
	d.cmd = exec.Command(bin("devplane"), "--xds-address", addr, "--services", file, "--debug-address", "")
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("devplane log:\n%s", d.log)
		}
	})
	waitFor(t, "devplane's xDS port", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return d
}

func (d *devplaneProc) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// writeServices points the test service at backend, writing beside and renaming.
func writeServices(t *testing.T, file, backend string) {
	t.Helper()
	host, port, err := net.SplitHostPort(backend)
	if err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf(`services:
- hostname: reviews.default.svc.cluster.local
  namespace: default
  addresses: [10.96.0.12]
  ports: [{name: grpc, port: 9080, protocol: GRPC}]
  endpoints: [{address: %s, port: %s}]
`, host, port)
	if err := os.WriteFile(file+".tmp", []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		t.Fatal(err)
	}
}

// caller makes RPCs on cc without pause until stopped, counting failures.
type caller struct {
	calls, failures atomic.Int64
	lastErr         atomic.Value
	stop            chan struct{}
	wg              sync.WaitGroup
}

func startCalls(cc *grpc.ClientConn) *caller {
	c := &caller{stop: make(chan struct{})}
	c.wg.Go(func() {
		for {
			select {
			case <-c.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := devplanetest.Call(ctx, cc)
			cancel()
			c.calls.Add(1)
			if err != nil {
				c.failures.Add(1)
				c.lastErr.Store(err.Error())
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	return c
}

func (c *caller) end(t *testing.T, what string) {
	t.Helper()
	close(c.stop)
	c.wg.Wait()
	if n := c.failures.Load(); n > 0 {
		t.Errorf("%s: %d of %d RPCs failed, last: %v", what, n, c.calls.Load(), c.lastErr.Load())
	}
	if c.calls.Load() == 0 {
		t.Errorf("%s: no RPC was made", what)
	}
	t.Logf("%s: %d RPCs, %d failed", what, c.calls.Load(), c.failures.Load())
}

// TestProxylessThroughAgentd: devplane (a real go-control-plane) upstream, agentd with
// xds-proxy in the middle, and a grpc-go xDS client reading the bootstrap agentd wrote,
// making real RPCs to real backends: it follows an endpoint move, keeps working while
// devplane restarts and then follows the new devplane, and keeps working while xds-proxy is
// swapped for another binary.
func TestProxylessThroughAgentd(t *testing.T) {
	b1, b2 := devplanetest.Backend(t), devplanetest.Backend(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeServices(t, file, b1)
	// Port 15010 is istiod's plaintext port (xDS and CA without TLS); a random loopback
	// address keeps it apart from anything else on the machine.
	addr := fmt.Sprintf("127.%d.%d.%d:15010", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1)
	dev := startDevplane(t, addr, file)

	a := startAgentd(t, []string{
		"POD_NAME=app-1", "POD_NAMESPACE=default", "INSTANCE_IP=127.0.0.1", "ISTIO_META_DNS_CAPTURE=true",
	}, "--disable-envoy", "--discovery-address", addr, "--ready-timeout", "5s")
	waitChild(t, a, "xds-proxy", running)

	bootstrap, err := os.ReadFile(filepath.Join(a.Root, "etc/istio/proxy/grpc-bootstrap.json"))
	if err != nil {
		t.Fatalf("agentd wrote no gRPC bootstrap: %v", err)
	}
	cc := devplanetest.Dial(t, bootstrap, devplanetest.Target)
	devplanetest.WaitBackend(t, cc, b1)
	// The client's LDS request made xds-proxy ask for NDS: the table reached dns-proxy over
	// the bus (dns-proxy turns ready only with a table).
	waitChild(t, a, "dns-proxy", running)

	writeServices(t, file, b2)
	devplanetest.WaitBackend(t, cc, b2)

	calls := startCalls(cc)
	dev.stop()
	time.Sleep(time.Second) // RPCs go on from the client's last configuration
	dev = startDevplane(t, addr, file)
	calls.end(t, "devplane restart")
	writeServices(t, file, b1)
	devplanetest.WaitBackend(t, cc, b1) // through a new stream to the new devplane

	old := childPid(t, a, "xds-proxy")
	data, err := os.ReadFile(bin("xds-proxy"))
	if err != nil {
		t.Fatal(err)
	}
	copyBin := filepath.Join(t.TempDir(), "xds-proxy")
	if err := os.WriteFile(copyBin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	calls = startCalls(cc)
	if out, err := a.CLI("swap", "xds-proxy", "--binary", copyBin, "--sha256", sha256Hex(data)); err != nil {
		t.Fatalf("agentd swap xds-proxy: %v\n%s", err, out)
	}
	waitFor(t, "the old xds-proxy to exit", func() bool { return !alive(old) })
	calls.end(t, "swap")
	if now := childPid(t, a, "xds-proxy"); now == old {
		t.Fatalf("xds-proxy pid %d unchanged after the swap", now)
	}
	writeServices(t, file, b2)
	devplanetest.WaitBackend(t, cc, b2) // through the new xds-proxy
}

func running(s supervisor.Status) bool { return s.State == supervisor.Running }

// waitChild waits until the named child's status satisfies cond.
func waitChild(t *testing.T, a *Agentd, name string, cond func(supervisor.Status) bool) supervisor.Status {
	t.Helper()
	var got supervisor.Status
	waitFor(t, name+" running", func() bool {
		st, err := a.Status()
		if err != nil {
			return false
		}
		for _, c := range st.Children {
			if c.Name == name {
				got = c
				return cond(c)
			}
		}
		return false
	})
	return got
}

func childPid(t *testing.T, a *Agentd, name string) int {
	t.Helper()
	return waitChild(t, a, name, running).Pid
}
