package xdsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// Type URLs the proxy treats specially.
const (
	HealthInfoType = "type.googleapis.com/istio.v1.HealthInformation"
	ListenerType   = "type.googleapis.com/envoy.config.listener.v3.Listener"
	workloadType   = "type.googleapis.com/istio.workload.Workload"
)

// slowSend is how long a send to the client may take before it is logged.
const slowSend = 10 * time.Second

// Config is the proxy's configuration.
type Config struct {
	Upstream Upstream
	// NameTable asks the control plane for NDS on every stream once the client's first LDS
	// request has passed (Istio does so when its DNS proxy is on), and publishes the table.
	NameTable bool
	// ProxyConfig asks for PCDS the same way (PROXY_CONFIG_XDS_AGENT) and publishes its CA
	// certificates as the trust bundle.
	ProxyConfig bool
	// Wasm, when set, rewrites ECDS responses before they are forwarded: remote Wasm code
	// becomes a local file (ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION).
	Wasm Converter
}

// Publisher is the bus, as the proxy uses it.
type Publisher interface {
	Publish(ctx context.Context, topic string, m proto.Message) error
}

// Proxy is the xDS proxy. It serves ADS (SotW and delta) to any number of clients at once.
type Proxy struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer

	cfg     Config
	log     hclog.Logger
	bus     Publisher
	metrics *metrics
	server  *grpc.Server
	streams atomic.Uint64 // numbers the streams in logs

	mu       sync.Mutex
	sessions map[*session]struct{}
	health   *agentv1.WorkloadHealth // the last report, sent on every new stream
}

// NewProxy builds a proxy; bus receives the name table and trust bundle; its metrics go to reg.
func NewProxy(cfg Config, log hclog.Logger, bus Publisher, reg prometheus.Registerer) (*Proxy, error) {
	if cfg.Upstream.Address == "" {
		return nil, errors.New("no discovery address")
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, log: log, bus: bus, metrics: m, sessions: map[*session]struct{}{}}
	// Istio's downstream server settings.
	p.server = grpc.NewServer(
		grpc.ForceServerCodecV2(codec{}),
		grpc.MaxConcurrentStreams(100000),
		grpc.MaxRecvMsgSize(4<<20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveTime / 2}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.StatsHandler(m.recvMax),
	)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(p.server, p)
	reflection.Register(p.server)
	log.Info("xDS proxy", "upstream", cfg.Upstream.Address, "cluster", cfg.Upstream.ClusterID, "tls", cfg.Upstream.TLS)
	// Istio refuses to start without its xDS root; the proxy serves, and reads the root for
	// every upstream connection, so a root that appears (or rotates) later is used at once.
	if cfg.Upstream.TLS && cfg.Upstream.RootCert != "" {
		if _, err := loadRoots(cfg.Upstream.RootCert); err != nil {
			log.Warn("no usable xDS root yet: upstream connections fail until there is", "error", err)
		}
	}
	return p, nil
}

// Serve serves clients on l until ctx ends, then ends every stream.
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		p.server.Stop()
	}()
	err := p.server.Serve(l)
	<-stopped
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve xDS clients: %w", err)
	}
	return nil
}

// Drain stops taking new connections and asks the clients' connections to go away, so that
// their next streams go to a new xds-proxy; the streams open now continue until Serve ends.
func (p *Proxy) Drain(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.server.GracefulStop() // returns when Serve's Stop ends the remaining streams
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

// SetHealth reports the workload's health upstream on every stream that has passed its first
// LDS request, and on every later stream.
func (p *Proxy) SetHealth(h *agentv1.WorkloadHealth) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.health = h
	for s := range p.sessions {
		s.report(h)
	}
}

func (p *Proxy) currentHealth() *agentv1.WorkloadHealth {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.health
}

// StreamAggregatedResources proxies one SotW stream.
func (p *Proxy) StreamAggregatedResources(down discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return p.proxy(sotw, down)
}

// DeltaAggregatedResources proxies one delta stream.
func (p *Proxy) DeltaAggregatedResources(down discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return p.proxy(delta, down)
}

// handler returns how the proxy consumes responses of typeURL, or nil to forward them.
func (p *Proxy) handler(typeURL string) func(context.Context, *anypb.Any) error {
	switch {
	case typeURL == agentv1.TypeNameTable && p.cfg.NameTable:
		return p.publishNameTable
	case typeURL == agentv1.TypeProxyConfig && p.cfg.ProxyConfig:
		return p.publishTrustBundle
	}
	return nil
}

func (p *Proxy) publishNameTable(ctx context.Context, a *anypb.Any) error {
	nt := &ndsv1.NameTable{}
	if err := a.UnmarshalTo(nt); err != nil {
		return fmt.Errorf("decode name table: %w", err)
	}
	return p.bus.Publish(ctx, agentv1.TopicNameTable, nt)
}

func (p *Proxy) publishTrustBundle(ctx context.Context, a *anypb.Any) error {
	pc := &meshv1alpha1.ProxyConfig{}
	if err := a.UnmarshalTo(pc); err != nil {
		return fmt.Errorf("decode proxy config: %w", err)
	}
	return p.bus.Publish(ctx, agentv1.TopicTrustBundle, &agentv1.TrustBundle{CaCertificatesPem: pc.GetCaCertificatesPem()})
}

// forwarded reports whether responses of typeURL may reach the client, as Istio filters them.
func forwarded(typeURL string) bool {
	return strings.HasPrefix(typeURL, "type.googleapis.com/envoy.") || typeURL == workloadType
}
