package component

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/agentd/agentd/internal/memory"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// Serve runs a helper binary: it answers agentd's handshake, waits for Configure, builds the
// helper with f and runs it until agentd drains and stops it. Call it from main and do nothing
// else there: stdout carries the handshake.
func Serve(name string, f Factory) { ServeVersion(ProtocolVersion, name, f) }

// ServeVersion is Serve speaking another protocol version; agentd's tests use it to build a
// helper that agentd must refuse.
func ServeVersion(version int, name string, f Factory) {
	level := hclog.LevelFromString(os.Getenv("AGENTD_LOG_LEVEL"))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	// JSON on stderr: agentd re-logs each line under the child's name at its level.
	log := hclog.New(&hclog.LoggerOptions{Name: name, Level: level, JSONFormat: true, Output: os.Stderr})
	// agentd starts a helper from the open file it verified (execveat), which names the process
	// after the descriptor ("5"): ps, top and /proc/PID/comm show the helper's name instead.
	if err := setProcessName(name); err != nil {
		log.Debug("cannot name the process", "error", err)
	}

	if _, set := os.LookupEnv("GOGC"); !set {
		memory.GCPercentFromFirstCollection(memory.TreeGCPercent)
	}

	files, err := inheritedSockets()
	if err != nil {
		log.Error("inherited sockets", "error", err)
		os.Exit(2)
	}
	cs := &childServer{name: name, factory: f, log: log, files: files}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: handshake(version),
		Plugins:         plugin.PluginSet{pluginName: &grpcPlugin{server: cs}},
		GRPCServer:      plugin.DefaultGRPCServer,
		Logger:          log,
	})
}

// inheritedSockets reads the sockets agentd handed down with the systemd convention
// (LISTEN_FDS, LISTEN_FDNAMES). agentd cannot know a child's pid before it exists, so it leaves
// LISTEN_PID unset and the child, the only reader, claims it.
func inheritedSockets() (map[string]*os.File, error) {
	if os.Getenv("LISTEN_FDS") == "" {
		return map[string]*os.File{}, nil
	}
	if os.Getenv("LISTEN_PID") == "" {
		os.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	}
	byName := activation.FilesWithNames()
	files := make(map[string]*os.File, len(byName))
	for name, fs := range byName {
		if len(fs) != 1 {
			return nil, fmt.Errorf("%d sockets named %q, want one", len(fs), name)
		}
		files[name] = fs[0]
	}
	return files, nil
}

// childServer is the helper side of the Component service.
type childServer struct {
	agentv1.UnimplementedComponentServer
	name    string
	factory Factory
	log     hclog.Logger
	files   map[string]*os.File
	broker  *plugin.GRPCBroker

	mu       sync.Mutex
	helper   Helper
	registry *prometheus.Registry
	cancel   context.CancelFunc
	done     chan struct{} // closed when Run returned
	draining bool
}

func (s *childServer) Configure(_ context.Context, req *agentv1.ConfigureRequest) (*agentv1.ConfigureResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.helper != nil {
		return nil, status.Error(codes.FailedPrecondition, "already configured")
	}
	for _, name := range req.GetSockets() {
		if _, ok := s.files[name]; !ok {
			return nil, status.Errorf(codes.InvalidArgument, "socket %q was not inherited", name)
		}
	}
	conn, err := s.broker.Dial(req.GetBusBrokerId())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "dial the bus: %v", err)
	}
	env := &Env{
		Name:    s.name,
		Root:    req.GetRoot(),
		Config:  req.GetConfig(),
		Log:     s.log,
		Bus:     NewBus(agentv1.NewBusClient(conn)),
		Metrics: prometheus.NewRegistry(),
		files:   s.files,
	}
	h, err := s.factory(env)
	if err != nil {
		conn.Close()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.helper, s.registry, s.cancel, s.done = h, env.Metrics, cancel, make(chan struct{})
	go s.run(ctx, h, func() { conn.Close() })
	return &agentv1.ConfigureResponse{}, nil
}

// run runs the helper. A helper that stops on its own, not asked to by a drain, ends the
// process so that agentd sees the exit and restarts it.
func (s *childServer) run(ctx context.Context, h Helper, cleanup func()) {
	err := h.Run(ctx)
	cleanup()
	close(s.done)
	s.mu.Lock()
	asked := s.draining
	s.mu.Unlock()
	if asked {
		return
	}
	if err != nil {
		s.log.Error("helper stopped", "error", err)
		os.Exit(1)
	}
	s.log.Warn("helper stopped on its own")
	os.Exit(0)
}

func (s *childServer) Ready(context.Context, *agentv1.ReadyRequest) (*agentv1.ReadyResponse, error) {
	s.mu.Lock()
	h := s.helper
	s.mu.Unlock()
	if h == nil {
		return &agentv1.ReadyResponse{Reason: "not configured"}, nil
	}
	if err := h.Ready(); err != nil {
		return &agentv1.ReadyResponse{Reason: err.Error()}, nil
	}
	return &agentv1.ReadyResponse{Ready: true}, nil
}

func (s *childServer) Drain(ctx context.Context, req *agentv1.DrainRequest) (*agentv1.DrainResponse, error) {
	s.mu.Lock()
	h, cancel, done := s.helper, s.cancel, s.done
	s.draining = true
	s.mu.Unlock()
	if h == nil {
		return &agentv1.DrainResponse{}, nil
	}
	deadline := time.Now().Add(5 * time.Second)
	if req.GetDeadline() != nil {
		deadline = req.GetDeadline().AsTime()
	}
	ctx, stop := context.WithDeadline(ctx, deadline)
	defer stop()
	if d, ok := h.(Drainer); ok {
		if err := d.Drain(ctx); err != nil {
			s.log.Warn("drain", "error", err)
		}
	}
	cancel()
	select {
	case <-done:
		return &agentv1.DrainResponse{}, nil
	case <-ctx.Done():
		return nil, status.Error(codes.DeadlineExceeded, "helper did not stop by the drain deadline")
	}
}

func (s *childServer) Metrics(context.Context, *agentv1.MetricsRequest) (*agentv1.MetricsResponse, error) {
	s.mu.Lock()
	reg := s.registry
	s.mu.Unlock()
	if reg == nil {
		return &agentv1.MetricsResponse{}, nil
	}
	families, err := reg.Gather()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "gather metrics: %v", err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range families {
		if err := enc.Encode(mf); err != nil {
			return nil, status.Errorf(codes.Internal, "encode metrics: %v", err)
		}
	}
	return &agentv1.MetricsResponse{Text: buf.Bytes()}, nil
}

// setProcessName names the process (its main thread's comm, what ps and top show; the kernel
// keeps 15 bytes).
func setProcessName(name string) error {
	return os.WriteFile("/proc/self/comm", []byte(name), 0)
}
