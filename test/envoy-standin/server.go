package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/agentd/agentd/internal/testing/configcheck"
)

// Envoy's server states, as server.state reports them.
const (
	stateLive            = 0
	stateDraining        = 1
	statePreInitializing = 2
	stateInitializing    = 3
)

func timestamp() string { return time.Now().UTC().Format("2006-01-02 15:04:05.000") }

// server is the stand-in's whole state.
type server struct {
	opts      *options
	bootstrap *bootstrapv3.Bootstrap
	stats     *stats
	started   time.Time

	quit chan struct{} // closed by /quitquitquit
	once sync.Once

	mu        sync.Mutex
	draining  bool
	listeners map[string]*tcpListener // LDS listeners by name
}

func run(ctx context.Context, o *options) error {
	b, err := loadBootstrap(o)
	if err != nil {
		return err
	}
	s := &server{opts: o, bootstrap: b, stats: newStats(), started: time.Now(), quit: make(chan struct{}), listeners: map[string]*tcpListener{}}
	s.stats.set("server.state", statePreInitializing)
	s.stats.set("listener_manager.workers_started", 0)
	s.stats.set("server.concurrency", uint64(o.concurrency))
	logf("info", "main", "initializing epoch 0 (base id=0, hot restart version=disabled)")
	logf("info", "main", "envoy-standin: a test stand-in for Envoy, not Envoy; node id %s", b.GetNode().GetId())

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The process exits as soon as run returns, as Envoy does: nothing waits for wg.
	var wg sync.WaitGroup

	admin, err := s.serveAdmin(ctx, &wg)
	if err != nil {
		return err
	}
	defer admin.Close()
	if err := s.serveStaticListeners(ctx, &wg); err != nil {
		return err
	}
	s.stats.set("server.state", stateInitializing)
	if dr := b.GetDynamicResources(); dr.GetAdsConfig() != nil {
		path, err := s.clusterPipe(dr.GetAdsConfig().GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName())
		if err != nil {
			return fmt.Errorf("ads_config: %w", err)
		}
		delta := dr.GetAdsConfig().GetApiType() == corev3.ApiConfigSource_DELTA_GRPC
		c := newXDSClient(s, path, delta)
		wg.Add(1)
		go func() { defer wg.Done(); c.run(ctx) }()
	} else {
		s.markLive()
	}
	if path, err := s.clusterPipe("sds-grpc"); err == nil {
		c := newSDSClient(s, path)
		wg.Add(1)
		go func() { defer wg.Done(); c.run(ctx) }()
	}

	select {
	case <-ctx.Done():
		logf("warning", "main", "caught SIGTERM")
	case <-s.quit:
		logf("info", "main", "shutting down server instance")
	}
	cancel()
	s.closeListeners()
	logf("info", "main", "exiting")
	return nil
}

// loadBootstrap reads -c (JSON or YAML), merges --config-yaml over it and validates the
// result fully.
func loadBootstrap(o *options) (*bootstrapv3.Bootstrap, error) {
	b := &bootstrapv3.Bootstrap{}
	if o.configPath != "" {
		data, err := os.ReadFile(o.configPath)
		if err != nil {
			return nil, fmt.Errorf("unable to read file: %s", o.configPath)
		}
		if ext := filepath.Ext(o.configPath); ext == ".yaml" || ext == ".yml" {
			if data, err = yaml.YAMLToJSON(data); err != nil {
				return nil, fmt.Errorf("unable to convert YAML as JSON: %w", err)
			}
		}
		if err := protojson.Unmarshal(data, b); err != nil {
			// Envoy reads a .json file that is not strict JSON as YAML, as Istio's template
			// needs in one branch (a trailing comma).
			js, yerr := yaml.YAMLToJSON(data)
			if yerr != nil || protojson.Unmarshal(js, b) != nil {
				return nil, fmt.Errorf("unable to parse JSON as proto (%s): %w", o.configPath, err)
			}
		}
	}
	if o.configYAML != "" {
		js, err := yaml.YAMLToJSON([]byte(o.configYAML))
		if err != nil {
			return nil, fmt.Errorf("--config-yaml: %w", err)
		}
		overlay := &bootstrapv3.Bootstrap{}
		if err := protojson.Unmarshal(js, overlay); err != nil {
			return nil, fmt.Errorf("--config-yaml: %w", err)
		}
		proto.Merge(b, overlay)
	}
	if err := configcheck.Validate(b); err != nil {
		return nil, fmt.Errorf("bootstrap validation failed: %w", err)
	}
	return b, nil
}

// clusterPipe is the Unix socket path of a static cluster's only endpoint.
func (s *server) clusterPipe(name string) (string, error) {
	c := s.staticCluster(name)
	if c == nil {
		return "", fmt.Errorf("no static cluster %q", name)
	}
	p := endpointAddress(c).GetPipe().GetPath()
	if p == "" {
		return "", fmt.Errorf("cluster %q has no pipe address", name)
	}
	return p, nil
}

func (s *server) staticCluster(name string) *clusterv3.Cluster {
	for _, c := range s.bootstrap.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return c
		}
	}
	return nil
}

func endpointAddress(c *clusterv3.Cluster) *corev3.Address {
	for _, e := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range e.GetLbEndpoints() {
			if a := lb.GetEndpoint().GetAddress(); a != nil {
				return a
			}
		}
	}
	return nil
}

// markLive is the end of initialization: the first CDS and LDS updates are applied.
func (s *server) markLive() {
	if s.stats.get("server.state") == stateLive || s.isDraining() {
		return
	}
	s.stats.set("listener_manager.workers_started", 1)
	s.stats.set("server.state", stateLive)
	s.stats.set("server.live", 1)
	logf("info", "main", "all clusters initialized. initializing init manager")
	logf("info", "config", "all dependencies initialized. starting workers")
	logf("info", "main", "starting main dispatch loop")
}

func (s *server) isDraining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

// drain starts draining the listeners (only inbound ones when inboundOnly); after the drain
// time they stop listening, unless skipExit. Open connections are left to their clients.
func (s *server) drain(inboundOnly, skipExit bool) {
	s.mu.Lock()
	s.draining = true
	var ls []*tcpListener
	for _, l := range s.listeners {
		if !inboundOnly || l.inbound {
			ls = append(ls, l)
		}
	}
	s.mu.Unlock()
	s.stats.set("server.state", stateDraining)
	s.stats.set("listener_manager.total_listeners_draining", uint64(len(ls)))
	logf("info", "main", "draining %d listeners (inbound only: %v) for %ds, strategy %s", len(ls), inboundOnly, s.opts.drainTimeS, s.opts.drainStrategy)
	if skipExit {
		return
	}
	time.AfterFunc(time.Duration(s.opts.drainTimeS)*time.Second, func() {
		for _, l := range ls {
			l.stopListening()
		}
		logf("info", "main", "drain period over: %d listeners stopped", len(ls))
	})
}

func (s *server) shutdown() { s.once.Do(func() { close(s.quit) }) }

func (s *server) closeListeners() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.listeners {
		l.close()
	}
}

// listenTCP binds a socket address from the configuration.
func listenTCP(a *corev3.SocketAddress) (net.Listener, error) {
	addr := net.JoinHostPort(a.GetAddress(), fmt.Sprint(a.GetPortValue()))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.New("cannot bind '" + addr + "': " + err.Error())
	}
	return l, nil
}
