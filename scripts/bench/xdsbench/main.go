// Command xdsbench measures what xds-proxy costs: the time an Envoy-like ADS client takes to
// receive the full state and then pushes of every endpoint, straight from devplane and through
// `agentd run`'s xds-proxy, in one run, and the memory of the xds-proxy process. Run it with
// scripts/bench/xds.sh.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/testing/devplane"
)

func main() {
	agentd := flag.String("agentd", "", "the agentd binary (its helpers beside it)")
	clusters := flag.Int("clusters", 2000, "services, one cluster each")
	endpoints := flag.Int("endpoints", 10000, "endpoints in all")
	pushes := flag.Int("pushes", 10, "pushes of every endpoint per measured connection")
	rounds := flag.Int("rounds", 3, "rounds of direct then proxied connections, per flavour")
	logFile := flag.String("agentd-log", os.DevNull, "where agentd's log goes")
	flag.Parse()
	if err := run(*agentd, *logFile, *clusters, *endpoints, *pushes, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "xdsbench:", err)
		os.Exit(1)
	}
}

func run(agentd, logFile string, clusters, endpoints, pushes, rounds int) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Port 15010 (plaintext) on a random loopback address of its own.
	addr := fmt.Sprintf("127.%d.%d.%d:15010", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	dev := devplane.New(ctx, hclog.NewNullLogger())
	if err := dev.Update(ctx, services(clusters, endpoints, 0)); err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- dev.Serve(ctx, l) }()
	defer func() { cancel(); <-served }()

	root, err := os.MkdirTemp("", "xdsbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	stop, err := startAgentd(agentd, logFile, root, addr)
	if err != nil {
		return err
	}
	defer stop()
	pid, err := xdsProxyPid(agentd, root)
	if err != nil {
		return err
	}
	rssStart := procMemKB(pid, "VmRSS")

	fmt.Printf("push of %d endpoints in %d clusters (EDS), %d pushes per connection, %d rounds\n", endpoints, clusters, pushes, rounds)
	fmt.Printf("%-6s %-7s %12s %12s %12s %12s\n", "xds", "path", "initial p50", "push p50", "push p90", "MB/push")
	version := 0
	for _, delta := range []bool{false, true} {
		results := map[string][]measurement{}
		for range rounds {
			for _, path := range []struct{ name, target string }{{"direct", addr}, {"proxy", "unix://" + filepath.Join(root, "etc/istio/proxy/XDS")}} {
				m, err := measure(ctx, dev, path.target, delta, clusters, endpoints, pushes, &version)
				if err != nil {
					return fmt.Errorf("%s: %w", path.name, err)
				}
				results[path.name] = append(results[path.name], m)
			}
		}
		flavour := map[bool]string{false: "sotw", true: "delta"}[delta]
		var initial, push [2]time.Duration
		var updates []time.Duration
		for i, name := range []string{"direct", "proxy"} {
			m := merge(results[name])
			initial[i], push[i] = quantile(m.initial, 0.5), quantile(m.pushes, 0.5)
			updates = append(updates, m.updates...)
			fmt.Printf("%-6s %-7s %10.1fms %10.1fms %10.1fms %12.2f\n", flavour, name, ms(initial[i]),
				ms(push[i]), ms(quantile(m.pushes, 0.9)), float64(m.bytes)/float64(len(m.pushes))/1e6)
		}
		fmt.Printf("%-6s proxy/direct: initial %.2f (%+.1f ms), push %.2f (%+.1f ms); devplane's own update p50 %.1f ms of each push\n",
			flavour, float64(initial[1])/float64(initial[0]), ms(initial[1]-initial[0]),
			float64(push[1])/float64(push[0]), ms(push[1]-push[0]), ms(quantile(updates, 0.5)))
	}
	fmt.Printf("xds-proxy memory: RSS %.1f MB at start, %.1f MB now, peak %.1f MB\n",
		float64(rssStart)/1024, float64(procMemKB(pid, "VmRSS"))/1024, float64(procMemKB(pid, "VmHWM"))/1024)
	return nil
}

// services are n services with endpoints spread over them, each endpoint on port
// 10000+version, so that every push changes every endpoint.
func services(n, endpoints, version int) []devplane.Service {
	out := make([]devplane.Service, n)
	for i := range out {
		out[i] = devplane.Service{
			Hostname: fmt.Sprintf("svc-%d.bench.svc.cluster.local", i), Namespace: "bench", Registry: "Kubernetes",
			Addresses: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
			Ports:     []devplane.Port{{Name: "grpc", Port: 8080, Protocol: "GRPC"}},
		}
	}
	for e := range endpoints {
		s := &out[e%n]
		s.Endpoints = append(s.Endpoints, devplane.Endpoint{
			Address: fmt.Sprintf("10.%d.%d.%d", 1+e/65536, e/256%256, e%256), Port: uint32(10000 + version),
		})
	}
	return out
}

// measurement is what one or more connections took.
type measurement struct {
	initial []time.Duration // full state: CDS, then EDS for every cluster
	pushes  []time.Duration // each push, from devplane's update to the client holding it all
	updates []time.Duration // devplane's snapshot build within each push (the same either way)
	bytes   int             // bytes received for the pushes
}

func merge(ms []measurement) measurement {
	var out measurement
	for _, m := range ms {
		out.initial = append(out.initial, m.initial...)
		out.pushes = append(out.pushes, m.pushes...)
		out.updates = append(out.updates, m.updates...)
		out.bytes += m.bytes
	}
	return out
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// measure connects one Envoy-like client to target: CDS, then EDS for every cluster (the
// initial fetch), then pushes new endpoints and times each until the client holds them all.
func measure(ctx context.Context, dev *devplane.Server, target string, delta bool, clusters, endpoints, pushes int, version *int) (measurement, error) {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		return measurement{}, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := newClient(ctx, discoveryv3.NewAggregatedDiscoveryServiceClient(cc), delta)
	if err != nil {
		return measurement{}, err
	}
	var m measurement
	start := time.Now()
	names, err := c.clusters()
	if err != nil {
		return m, err
	}
	if err := c.endpoints(names, 10000+*version); err != nil {
		return m, err
	}
	m.initial = []time.Duration{time.Since(start)}
	for range pushes {
		*version++
		next := services(clusters, endpoints, *version)
		start := time.Now()
		if err := dev.Update(ctx, next); err != nil {
			return m, err
		}
		m.updates = append(m.updates, time.Since(start))
		c.bytes = 0
		if err := c.awaitEndpoints(10000 + *version); err != nil {
			return m, err
		}
		m.pushes = append(m.pushes, time.Since(start))
		m.bytes += c.bytes
	}
	return m, nil
}

// client is a minimal Envoy-like ADS client of either flavour.
type client struct {
	sotw  discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	delta discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	node  *corev3.Node
	bytes int
	have  map[string]int // endpoint port each cluster's endpoints are on
}

func newClient(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient, delta bool) (*client, error) {
	c := &client{node: &corev3.Node{Id: "sidecar~10.0.0.1~bench.bench~bench.svc.cluster.local"}, have: map[string]int{}}
	var err error
	if delta {
		c.delta, err = ads.DeltaAggregatedResources(ctx)
	} else {
		c.sotw, err = ads.StreamAggregatedResources(ctx)
	}
	return c, err
}

// response is a response of either flavour, acknowledged on receipt.
type response struct {
	typeURL   string
	resources []*anypb.Any
}

func (c *client) subscribe(typeURL string, names []string) error {
	node := c.node
	c.node = nil // the node goes in the first request only
	if c.delta != nil {
		return c.delta.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNamesSubscribe: names})
	}
	return c.sotw.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names})
}

func (c *client) recv() (response, error) {
	if c.delta != nil {
		r, err := c.delta.Recv()
		if err != nil {
			return response{}, err
		}
		c.bytes += proto.Size(r)
		out := response{typeURL: r.TypeUrl}
		for _, res := range r.Resources {
			out.resources = append(out.resources, res.Resource)
		}
		return out, c.delta.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce})
	}
	r, err := c.sotw.Recv()
	if err != nil {
		return response{}, err
	}
	c.bytes += proto.Size(r)
	return response{typeURL: r.TypeUrl, resources: r.Resources},
		c.sotw.Send(&discoveryv3.DiscoveryRequest{TypeUrl: r.TypeUrl, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce, ResourceNames: c.names(r.TypeUrl)})
}

// names are the EDS names a SotW client keeps asking for in its ACKs.
func (c *client) names(typeURL string) []string {
	if typeURL != resourcev3.EndpointType {
		return nil
	}
	out := make([]string, 0, len(c.have))
	for n := range c.have {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (c *client) clusters() ([]string, error) {
	if err := c.subscribe(resourcev3.ClusterType, nil); err != nil {
		return nil, err
	}
	for {
		r, err := c.recv()
		if err != nil {
			return nil, err
		}
		if r.typeURL != resourcev3.ClusterType {
			continue
		}
		var names []string
		for _, a := range r.resources {
			if n := resourceName(a); strings.HasPrefix(n, "outbound|") {
				names = append(names, n)
			}
		}
		return names, nil
	}
}

func (c *client) endpoints(names []string, port int) error {
	for _, n := range names {
		c.have[n] = 0
	}
	if err := c.subscribe(resourcev3.EndpointType, c.names(resourcev3.EndpointType)); err != nil {
		return err
	}
	return c.awaitEndpoints(port)
}

// awaitEndpoints reads responses until every cluster's endpoints are on port.
func (c *client) awaitEndpoints(port int) error {
	for {
		done := 0
		for _, p := range c.have {
			if p == port {
				done++
			}
		}
		if done == len(c.have) {
			return nil
		}
		r, err := c.recv()
		if err != nil {
			return err
		}
		if r.typeURL != resourcev3.EndpointType {
			continue
		}
		for _, a := range r.resources {
			var cla endpointv3.ClusterLoadAssignment
			if err := a.UnmarshalTo(&cla); err != nil {
				return err
			}
			p := 0
			for _, le := range cla.GetEndpoints() {
				for _, e := range le.GetLbEndpoints() {
					p = int(e.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue())
				}
			}
			c.have[cla.ClusterName] = p
		}
	}
}

func resourceName(a *anypb.Any) string {
	m, err := a.UnmarshalNew()
	if err != nil {
		return ""
	}
	if n, ok := m.(interface{ GetName() string }); ok {
		return n.GetName()
	}
	return ""
}

// startAgentd runs `agentd run --disable-envoy` against devplane at addr.
func startAgentd(agentd, logFile, root, addr string) (func(), error) {
	logOut, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(agentd, "run", "--root", root, "--disable-envoy", "--discovery-address", addr,
		"--dns-address", "127.0.0.1:0", "--log-level", "warn")
	cmd.Env = append(os.Environ(), "POD_NAME=bench", "POD_NAMESPACE=bench", "INSTANCE_IP=127.0.0.1")
	cmd.Stdout, cmd.Stderr = logOut, logOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logOut.Close()
		return nil, err
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		logOut.Close()
	}
	return stop, nil
}

// xdsProxyPid waits until agentd runs xds-proxy and returns its pid.
func xdsProxyPid(agentd, root string) (int, error) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		out, err := exec.Command(agentd, "status", "--root", root, "--json").Output()
		if err == nil {
			var st struct {
				Children []struct {
					Name  string `json:"name"`
					Pid   int    `json:"pid"`
					State string `json:"state"`
				} `json:"children"`
			}
			if json.Unmarshal(out, &st) == nil {
				for _, c := range st.Children {
					if c.Name == "xds-proxy" && c.State == "running" {
						return c.Pid, nil
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, errors.New("xds-proxy never ran")
}

// procMemKB reads a Vm* line (kB) of /proc/<pid>/status.
func procMemKB(pid int, key string) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}
