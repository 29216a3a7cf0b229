// Package devplane is a small local stand-in for istiod: it serves xDS (ADS, SotW and delta)
// and Istio's NDS for the services of a YAML file, and records what its clients report.
package devplane

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"time"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
)

// Type URLs istiod serves or receives beside Envoy's.
const (
	HealthInfoType = "type.googleapis.com/istio.v1.HealthInformation"
)

// nameTableResource is the name of the single NDS resource.
const nameTableResource = "name-table"

// maxNACKs is how many NACKs the server remembers.
const maxNACKs = 100

// HealthReport is the last health report of one client (xds-proxy sends its workload's health).
type HealthReport struct {
	Healthy bool      `json:"healthy"`
	Message string    `json:"message,omitempty"`
	Time    time.Time `json:"time"`
}

// NACK is one rejected response.
type NACK struct {
	Node    string    `json:"node"`
	TypeURL string    `json:"typeUrl"`
	Nonce   string    `json:"nonce"`
	Message string    `json:"message"`
	Time    time.Time `json:"time"`
}

// Server serves the xDS resources of a set of services.
type Server struct {
	log       hclog.Logger
	snapshots cachev3.SnapshotCache
	names     *cachev3.LinearCache
	xds       serverv3.Server

	mu         sync.Mutex
	version    int
	services   []Service
	plugins    []WasmPlugin
	health     map[string]HealthReport // by node id
	nacks      []NACK
	deltaNodes map[int64]*corev3.Node // delta streams send their node only once
}

// New returns a server with no services; ctx bounds the xDS server's lifetime.
func New(ctx context.Context, log hclog.Logger) *Server {
	s := &Server{
		log:        log,
		snapshots:  cachev3.NewSnapshotCache(false, generatorHash{}, nil),
		names:      cachev3.NewLinearCache(agentv1.TypeNameTable),
		health:     map[string]HealthReport{},
		deltaNodes: map[int64]*corev3.Node{},
	}
	// NDS and health reports have caches of their own; every other type is a snapshot's.
	caches := map[string]cachev3.Cache{"": s.snapshots, agentv1.TypeNameTable: s.names, HealthInfoType: sink{}}
	pick := func(typeURL string) string {
		if _, ok := caches[typeURL]; ok {
			return typeURL
		}
		return ""
	}
	cache := &cachev3.MuxCache{
		Classify:      func(r *cachev3.Request) string { return pick(r.GetTypeUrl()) },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return pick(r.GetTypeUrl()) },
		Caches:        caches,
	}
	s.xds = serverv3.NewServer(ctx, cache, serverv3.CallbackFuncs{
		StreamRequestFunc:      func(_ int64, r *discoveryv3.DiscoveryRequest) error { s.observe(r.GetNode(), r); return nil },
		StreamDeltaRequestFunc: s.observeDelta,
		DeltaStreamClosedFunc: func(id int64, _ *corev3.Node) {
			s.mu.Lock()
			delete(s.deltaNodes, id)
			s.mu.Unlock()
		},
	})
	return s
}

// Register adds the ADS service to g.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
}

// Update serves services from now on; clients get a push when anything changed.
func (s *Server) Update(ctx context.Context, services []Service) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.update(ctx, services, s.plugins)
}

// UpdateFile serves the services and Wasm plugins of f from now on.
func (s *Server) UpdateFile(ctx context.Context, f File) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.update(ctx, f.Services, f.WasmPlugins)
}

func (s *Server) update(ctx context.Context, services []Service, plugins []WasmPlugin) error {
	if s.version > 0 && reflect.DeepEqual(services, s.services) && reflect.DeepEqual(plugins, s.plugins) {
		return nil
	}
	version := strconv.Itoa(s.version + 1)
	for _, gen := range []string{generatorGRPC, generatorEnvoy} {
		res := resources(gen, services)
		if gen == generatorEnvoy {
			res = withPlugins(res, plugins, version)
		}
		snap, err := cachev3.NewSnapshot(version, res)
		if err != nil {
			return fmt.Errorf("build %s snapshot: %w", gen, err)
		}
		if err := s.snapshots.SetSnapshot(ctx, gen, snap); err != nil {
			return fmt.Errorf("set %s snapshot: %w", gen, err)
		}
	}
	if err := s.names.UpdateResource(nameTableResource, nameTable(services)); err != nil {
		return fmt.Errorf("set name table: %w", err)
	}
	s.version++
	s.services, s.plugins = services, plugins
	s.log.Info("serving services", "version", version, "services", len(services), "wasm_plugins", len(plugins))
	return nil
}

// Health returns the last health report of every client that sent one, by node id.
func (s *Server) Health() map[string]HealthReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]HealthReport, len(s.health))
	for k, v := range s.health {
		out[k] = v
	}
	return out
}

// NACKs returns the last rejected responses, oldest first.
func (s *Server) NACKs() []NACK {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]NACK(nil), s.nacks...)
}

func (s *Server) observeDelta(id int64, r *discoveryv3.DeltaDiscoveryRequest) error {
	s.mu.Lock()
	node := r.GetNode()
	if node != nil {
		s.deltaNodes[id] = node
	} else {
		node = s.deltaNodes[id]
	}
	s.mu.Unlock()
	s.observe(node, r)
	return nil
}

// request is what DiscoveryRequest and DeltaDiscoveryRequest share.
type request interface {
	GetTypeUrl() string
	GetResponseNonce() string
	GetErrorDetail() *status.Status
}

// observe records health reports and NACKs.
func (s *Server) observe(node *corev3.Node, r request) {
	id := node.GetId()
	switch {
	case r.GetTypeUrl() == HealthInfoType:
		rep := HealthReport{Healthy: r.GetErrorDetail() == nil, Message: r.GetErrorDetail().GetMessage(), Time: time.Now()}
		s.log.Info("health report", "node", id, "healthy", rep.Healthy, "message", rep.Message)
		s.mu.Lock()
		s.health[id] = rep
		s.mu.Unlock()
	case r.GetErrorDetail() != nil:
		n := NACK{Node: id, TypeURL: r.GetTypeUrl(), Nonce: r.GetResponseNonce(), Message: r.GetErrorDetail().GetMessage(), Time: time.Now()}
		s.log.Warn("NACK", "node", n.Node, "type", n.TypeURL, "nonce", n.Nonce, "error", n.Message)
		s.mu.Lock()
		s.nacks = append(s.nacks, n)
		if len(s.nacks) > maxNACKs {
			s.nacks = s.nacks[len(s.nacks)-maxNACKs:]
		}
		s.mu.Unlock()
	}
}

// generatorHash groups clients by the resource generator they need, so that one snapshot
// serves every client of a kind whatever its node id.
type generatorHash struct{}

func (generatorHash) ID(node *corev3.Node) string {
	if node.GetMetadata().GetFields()["GENERATOR"].GetStringValue() == generatorGRPC {
		return generatorGRPC
	}
	return generatorEnvoy
}

// sink takes requests it never answers: istiod never answers health reports either.
type sink struct{}

func (sink) CreateWatch(*cachev3.Request, cachev3.Subscription, chan cachev3.Response) (func(), error) {
	return func() {}, nil
}

func (sink) CreateDeltaWatch(*cachev3.DeltaRequest, cachev3.Subscription, chan cachev3.DeltaResponse) (func(), error) {
	return func() {}, nil
}

func (sink) Fetch(context.Context, *cachev3.Request) (cachev3.Response, error) {
	return nil, errors.New("health reports cannot be fetched")
}
