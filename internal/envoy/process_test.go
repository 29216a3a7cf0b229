package envoy

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/envoy/bootstrap"
	"github.com/agentd/agentd/internal/testing/logbuf"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// standin is the Envoy stand-in binary (test/envoy-standin), built once by TestMain.
var standin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "envoy-standin")
	if err != nil {
		panic(err)
	}
	standin = filepath.Join(dir, "envoy")
	if out, err := exec.Command("go", "build", "-o", standin, "github.com/agentd/agentd/test/envoy-standin").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the envoy stand-in: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/agentd/agentd/internal/proc.Start.func1.1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// controlPlane is a go-control-plane ADS + SDS server on the root's XDS and SDS sockets.
type controlPlane struct {
	cache  cachev3.SnapshotCache
	nodeID string

	mu    sync.Mutex
	acks  map[string]int // ACKs by type
	nacks int
}

func startControlPlane(t *testing.T, root, nodeID string) *controlPlane {
	t.Helper()
	cp := &controlPlane{cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), nodeID: nodeID, acks: map[string]int{}}
	cb := serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			cp.count(r.GetTypeUrl(), r.GetResponseNonce(), r.GetErrorDetail() != nil)
			return nil
		},
		StreamDeltaRequestFunc: func(_ int64, r *discoveryv3.DeltaDiscoveryRequest) error {
			cp.count(r.GetTypeUrl(), r.GetResponseNonce(), r.GetErrorDetail() != nil)
			return nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, cp.cache, cb)
	for _, sock := range []struct {
		path     string
		register func(*grpc.Server)
	}{
		{filepath.Join(root, "etc/istio/proxy/XDS"), func(g *grpc.Server) { discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, srv) }},
		{filepath.Join(root, bootstrap.DefaultSDSSocket), func(g *grpc.Server) { secretv3.RegisterSecretDiscoveryServiceServer(g, srv) }},
	} {
		if err := os.MkdirAll(filepath.Dir(sock.path), 0o755); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", sock.path)
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		sock.register(g)
		go g.Serve(l)
		t.Cleanup(g.Stop)
	}
	t.Cleanup(cancel)
	return cp
}

func (cp *controlPlane) count(typeURL, nonce string, nack bool) {
	if nonce == "" {
		return
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if nack {
		cp.nacks++
	} else {
		cp.acks[typeURL]++
	}
}

func (cp *controlPlane) acked(typeURL string) int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.acks[typeURL]
}

// serve publishes one inbound TCP listener on port, and the workload's secrets.
func (cp *controlPlane) serve(t *testing.T, version string, port int) {
	t.Helper()
	tcp, err := anypb.New(&tcpproxyv3.TcpProxy{StatPrefix: "inbound", ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: "inbound|app"}})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType: {&clusterv3.Cluster{
			Name:                 "inbound|app",
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
			ConnectTimeout:       durationpb.New(time.Second),
			LoadAssignment: &endpointv3.ClusterLoadAssignment{
				ClusterName: "inbound|app",
				Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
					HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: tcpAddress("127.0.0.1", 9)}},
				}}}},
			},
		}},
		resourcev3.ListenerType: {&listenerv3.Listener{
			Name:             "virtualInbound",
			Address:          tcpAddress("127.0.0.1", port),
			TrafficDirection: corev3.TrafficDirection_INBOUND,
			FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
				Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: tcp},
			}}}},
		}},
		resourcev3.SecretType: {
			&tlsv3.Secret{Name: "default", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
				CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "cert"}},
				PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "key"}},
			}}},
			&tlsv3.Secret{Name: "ROOTCA", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "root"}},
			}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.cache.SetSnapshot(context.Background(), cp.nodeID, snap); err != nil {
		t.Fatal(err)
	}
}

func tcpAddress(host string, port int) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       host,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
	}}}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func countIn(b *logbuf.Buffer, sub string) int { return strings.Count(b.String(), sub) }

// rig is a stand-in Envoy with its bootstrap, control plane and log.
type rig struct {
	root    string
	cfg     *bootstrap.Config
	opts    ProcessOptions
	cp      *controlPlane
	log     *logbuf.Buffer
	appPort int
}

func newRig(t *testing.T, delta bool, modify func(*ProcessOptions)) *rig {
	t.Helper()
	root, err := os.MkdirTemp("", "ev") // short: Unix socket paths are at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	pc := bootstrap.DefaultProxyConfig()
	pc.ProxyAdminPort = int32(freePort(t))
	pc.StatusPort = int32(freePort(t))
	pc.DrainDuration = durationpb.New(time.Second)
	cfg := &bootstrap.Config{
		Type: bootstrap.Sidecar, PodName: "app-1", PodNamespace: "default", IPs: []string{"127.0.0.1"},
		ProxyConfig: pc, DeltaXDS: delta, ExitOnZeroActiveConnections: true,
		EnvoyStatusPort: freePort(t), EnvoyPrometheusPort: freePort(t),
	}
	args, err := bootstrap.Args(cfg, bootstrap.CommandOptions{BootstrapPath: bootstrap.File, LogLevel: "warning,misc:error"})
	if err != nil {
		t.Fatal(err)
	}
	log := &logbuf.Buffer{}
	r := &rig{root: root, cfg: cfg, log: log, appPort: freePort(t)}
	r.opts = ProcessOptions{
		Args: args, Dir: root, AdminHost: "127.0.0.1", AdminPort: int(pc.ProxyAdminPort),
		InboundOnly: true, TerminationDrainDuration: 5 * time.Second, MinimumDrainDuration: 5 * time.Second,
		ExcludedListeners: IstioListenerStats(cfg.EnvoyStatusPort, cfg.EnvoyPrometheusPort),
		Prepare:           func() error { return bootstrap.Write(cfg, filepath.Join(root, bootstrap.File)) },
		Cleanup:           func() { os.Remove(filepath.Join(root, bootstrap.File)) },
		Log:               hclog.New(&hclog.LoggerOptions{Name: "envoy", Output: log, Level: hclog.Debug}),
	}
	if modify != nil {
		modify(&r.opts)
	}
	r.cp = startControlPlane(t, root, cfg.NodeID())
	return r
}

// start starts the stand-in; the test's end kills it if it still runs.
func (r *rig) start(t *testing.T) *Process {
	t.Helper()
	p, err := Launch(r.opts)(context.Background(), standin, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := p.(*Process)
	t.Cleanup(func() {
		e.p.Kill()
		<-e.Exited()
		if t.Failed() {
			t.Logf("log:\n%s", r.log.String())
		}
	})
	return e
}

// waitReady polls Ready as the supervisor does.
func waitReady(t *testing.T, e *Process) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		err := e.Ready(ctx)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("not ready: %v", err)
		case <-e.Exited():
			t.Fatalf("exited before ready: %v", e.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// eventually waits until cond holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestProcessReadyOnlyAfterXDS(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(fmt.Sprintf("delta=%v", delta), func(t *testing.T) {
			r := newRig(t, delta, nil)
			e := r.start(t)
			ctx := context.Background()
			// Envoy is up and its ADS stream open, but nothing was answered yet.
			eventually(t, "the admin API", func() bool { _, err := e.Admin().Stats(ctx, "server.state"); return err == nil })
			if err := e.Ready(ctx); err == nil || !strings.Contains(err.Error(), "config not received from XDS server") {
				t.Fatalf("Ready before any xDS answer = %v, want config not received", err)
			}
			r.cp.serve(t, "1", r.appPort)
			waitReady(t, e)
			eventually(t, "CDS and LDS ACKs", func() bool {
				return r.cp.acked(resourcev3.ClusterType) > 0 && r.cp.acked(resourcev3.ListenerType) > 0
			})
			eventually(t, "the SDS ACK", func() bool { return r.cp.acked(resourcev3.SecretType) > 0 })
			if r.cp.nacks != 0 {
				t.Errorf("%d NACKs", r.cp.nacks)
			}
			info, err := e.Admin().ServerInfo(ctx)
			if err != nil || info.GetNode().GetId() != r.cfg.NodeID() || info.CommandLineOptions.DrainStrategy != "Immediate" {
				t.Errorf("ServerInfo = %v, %v", info, err)
			}
			m, err := e.Metrics(ctx)
			if err != nil || !bytes.Contains(m, []byte("envoy_server_state")) {
				t.Errorf("Metrics = %.200q, %v", m, err)
			}
			// The readiness listener routes /healthz/ready to the agent's status port.
			if _, err := os.Stat(filepath.Join(r.root, bootstrap.File)); err != nil {
				t.Errorf("bootstrap not written: %v", err)
			}
		})
	}
}

func TestProcessDrainWaitsForConnections(t *testing.T) {
	r := newRig(t, true, func(o *ProcessOptions) {
		o.ExitOnZeroActiveConnections = true
		o.MinimumDrainDuration = 100 * time.Millisecond
		o.PollInterval = 50 * time.Millisecond
	})
	e := r.start(t)
	r.cp.serve(t, "1", r.appPort)
	waitReady(t, e)
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", r.appPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually(t, "the connection to be counted", func() bool {
		n, _, err := e.Admin().ActiveConnections(context.Background(), r.opts.ExcludedListeners)
		return err == nil && n == 1
	})
	drained := make(chan error, 1)
	go func() { drained <- e.Drain(context.Background()) }()
	eventually(t, "three polls that see the connection", func() bool { return countIn(r.log, "there are still active connections") >= 3 })
	select {
	case err := <-drained:
		t.Fatalf("Drain returned (%v) while a client connection was open", err)
	default:
	}
	if err := e.Ready(context.Background()); err != nil {
		t.Errorf("Ready = %v: once ready, a process stays ready while it drains (agentd's status server turns 503)", err)
	}
	if err := e.Admin().Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "DRAINING") {
		t.Errorf("/ready while draining = %v, want DRAINING", err)
	}
	conn.Close()
	if err := <-drained; err != nil {
		t.Fatalf("Drain = %v", err)
	}
	if !strings.Contains(r.log.String(), "there are no more active connections") {
		t.Errorf("log lacks the end of the wait:\n%s", r.log.String())
	}
	if err := e.Stop(context.Background()); err != nil {
		t.Fatalf("Stop = %v", err)
	}
	if e.Err() != nil {
		t.Errorf("Envoy exited with %v after /quitquitquit, want status 0", e.Err())
	}
}

func TestProcessDrainBounded(t *testing.T) {
	r := newRig(t, false, func(o *ProcessOptions) {
		o.ExitOnZeroActiveConnections = true
		o.MinimumDrainDuration = 50 * time.Millisecond
		o.PollInterval = 50 * time.Millisecond
		o.MaxDrainDuration = 500 * time.Millisecond
	})
	e := r.start(t)
	r.cp.serve(t, "1", r.appPort)
	waitReady(t, e)
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", r.appPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually(t, "the connection to be counted", func() bool {
		n, _, _ := e.Admin().ActiveConnections(context.Background(), r.opts.ExcludedListeners)
		return n == 1
	})
	start := time.Now()
	err = e.Drain(context.Background())
	if err == nil || !strings.Contains(err.Error(), "drain cut short") {
		t.Fatalf("Drain with an open connection past MaxDrainDuration = %v, want cut short", err)
	}
	if d := time.Since(start); d < r.opts.MaxDrainDuration {
		t.Errorf("Drain returned after %v, before MaxDrainDuration %v", d, r.opts.MaxDrainDuration)
	}
}

func TestProcessDrainTerminationDuration(t *testing.T) {
	r := newRig(t, true, func(o *ProcessOptions) {
		o.ExitOnZeroActiveConnections = false
		o.TerminationDrainDuration = 300 * time.Millisecond
	})
	e := r.start(t)
	r.cp.serve(t, "1", r.appPort)
	waitReady(t, e)
	start := time.Now()
	if err := e.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < r.opts.TerminationDrainDuration {
		t.Errorf("Drain returned after %v, before the termination drain duration %v", d, r.opts.TerminationDrainDuration)
	}
	st, err := e.Admin().Stats(context.Background(), "^server.state$")
	if err != nil || len(st) != 1 || st[0].Value != "1" {
		t.Errorf("server.state after Drain = %v, %v; want 1 (DRAINING): drain_listeners was not called", st, err)
	}
	// Drain with skip_exit (Istio's /drain) makes the next Drain return at once.
	if err := e.DrainNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := e.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.log.String(), "skipping drain") {
		t.Error("second Drain after DrainNow did not skip")
	}
}

func TestProcessStopSteps(t *testing.T) {
	tests := []struct {
		name   string
		binary string
		args   []string
		admin  bool // the admin API answers
		want   []string
		exit   string // how the process ended
	}{
		{"quitquitquit", standin, nil, true, []string{"POST /quitquitquit"}, ""},
		{"SIGTERM when the admin API does not answer", "/bin/sh", []string{"-c", "exec sleep 60"}, false,
			[]string{"POST /quitquitquit", "SIGTERM"}, "signal: terminated"},
		{"SIGKILL when SIGTERM is ignored", "/bin/sh", []string{"-c", "trap '' TERM; exec sleep 60"}, false,
			[]string{"POST /quitquitquit", "SIGTERM", "SIGKILL"}, "signal: killed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, false, nil)
			if tt.args != nil {
				r.opts.Args, r.opts.Prepare = tt.args, nil
			}
			e, err := Start(tt.binary, r.opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.p.Kill(); <-e.Exited() })
			if tt.admin {
				eventually(t, "the admin API", func() bool { _, err := e.Admin().Stats(context.Background(), "x"); return err == nil })
			} else { // the shell has set its trap and become sleep
				eventually(t, "sleep to run", func() bool {
					comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", e.Pid()))
					return strings.TrimSpace(string(comm)) == "sleep"
				})
			}
			limit := 2 * time.Second // the shell cases wait it out
			if tt.admin {
				limit = 20 * time.Second // Envoy exits after /quitquitquit long before
			}
			ctx, cancel := context.WithTimeout(context.Background(), limit)
			defer cancel()
			err = e.Stop(ctx)
			<-e.Exited()
			got := ""
			if e.Err() != nil {
				got = e.Err().Error()
			}
			if got != tt.exit {
				t.Errorf("exit = %q, want %q", got, tt.exit)
			}
			if (tt.exit == "signal: killed") != (err != nil) {
				t.Errorf("Stop = %v", err)
			}
			log := r.log.String()
			last := -1
			for _, step := range tt.want {
				i := strings.Index(log, "step=\""+step+"\"")
				if i < 0 {
					i = strings.Index(log, "step="+step)
				}
				if i < last {
					t.Errorf("step %s missing or out of order in:\n%s", step, log)
				}
				last = i
			}
			if n := strings.Count(log, "stopping Envoy"); n != len(tt.want) {
				t.Errorf("%d stop steps, want %d:\n%s", n, len(tt.want), log)
			}
		})
	}
}

func TestProcessCrash(t *testing.T) {
	r := newRig(t, false, nil)
	e := r.start(t)
	r.cp.serve(t, "1", r.appPort)
	waitReady(t, e)
	if err := syscall.Kill(e.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-e.Exited()
	if e.Err() == nil || e.Err().Error() != "signal: killed" {
		t.Errorf("Err = %v, want signal: killed", e.Err())
	}
	if _, err := os.Stat(filepath.Join(r.root, bootstrap.File)); !os.IsNotExist(err) {
		t.Errorf("bootstrap left behind after exit: %v", err)
	}
	if !strings.Contains(r.log.String(), "too much memory") {
		t.Errorf("no OOM hint in the log:\n%s", r.log.String())
	}
}

// TestProcessOutputIsEnvoys: what Envoy writes (an access-log line, a log line of its own)
// reaches agentd's stdout and stderr byte for byte, whatever agentd's log level: nothing
// parses, re-levels or drops it, as under Istio's agent.
func TestProcessOutputIsEnvoys(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "envoy")
	access := `{"start_time":"2026-12-03T14:00:00.000Z","method":"GET","path":"/","response_code":200}`
	own := `[2026-12-03 14:00:00.000][1][warning][config] a warning from Envoy`
	body := "#!/bin/sh\nprintf '%s\\n' '" + access + "'\nprintf '%s\\n' '" + own + "' >&2\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	stdout, _ := os.Create(filepath.Join(dir, "stdout"))
	stderr, _ := os.Create(filepath.Join(dir, "stderr"))
	defer stdout.Close()
	defer stderr.Close()
	var log strings.Builder
	e, err := Start(script, ProcessOptions{Dir: dir, Stdout: stdout, Stderr: stderr,
		Log: hclog.New(&hclog.LoggerOptions{Output: &log, Level: hclog.Error})})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the script did not exit")
	}
	for f, want := range map[string]string{"stdout": access + "\n", "stderr": own + "\n"} {
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || string(got) != want {
			t.Errorf("Envoy's %s = %q (%v), want %q as written", f, got, err, want)
		}
	}
	if strings.Contains(log.String(), "start_time") || strings.Contains(log.String(), "a warning from Envoy") {
		t.Errorf("agentd's log carries Envoy's output:\n%s", log.String())
	}
}
