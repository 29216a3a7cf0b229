package devplane

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/agentd/agentd/internal/testing/samplewasm"
)

// Config is devplane's configuration; the zero value of each optional field is its default.
type Config struct {
	XDSAddress   string // where ADS is served; default 127.0.0.1:15010 (istiod's plaintext port)
	ServicesFile string // the services YAML, reloaded when it changes; required
	// DebugAddress is the debug HTTP server (/debug/health, /debug/nacks) and the sample Wasm
	// module's (/wasm/sample.wasm); "" for none.
	DebugAddress string
	// Register adds more gRPC services (the CA): on CAAddress when it is set, else beside
	// ADS on the xDS address, as istiod serves its CA.
	Register  []func(grpc.ServiceRegistrar)
	CAAddress string
	CATLS     *tls.Config  // TLS of CAAddress (istiod's CA port is TLS); nil: plaintext
	Log       hclog.Logger // default: hclog's default logger
}

// reloadDelay lets an editor finish writing before the file is read again.
const reloadDelay = 100 * time.Millisecond

// Run serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.XDSAddress == "" {
		cfg.XDSAddress = "127.0.0.1:15010"
	}
	if cfg.Log == nil {
		cfg.Log = hclog.Default()
	}
	file, err := LoadFile(cfg.ServicesFile)
	if err != nil {
		return err
	}
	s := New(ctx, cfg.Log)
	if err := s.UpdateFile(ctx, file); err != nil {
		return err
	}
	xdsL, err := net.Listen("tcp", cfg.XDSAddress)
	if err != nil {
		return fmt.Errorf("listen for xDS: %w", err)
	}
	var caL, debugL net.Listener
	if cfg.CAAddress != "" {
		if caL, err = net.Listen("tcp", cfg.CAAddress); err != nil {
			return errors.Join(fmt.Errorf("listen for the CA: %w", err), xdsL.Close())
		}
		if cfg.CATLS != nil {
			caL = tls.NewListener(caL, cfg.CATLS)
		}
		cfg.Log.Info("serving the CA", "address", caL.Addr().String(), "tls", cfg.CATLS != nil)
	}
	if cfg.DebugAddress != "" {
		if debugL, err = net.Listen("tcp", cfg.DebugAddress); err != nil {
			return errors.Join(fmt.Errorf("listen for debug: %w", err), xdsL.Close(), closeIf(caL))
		}
		cfg.Log.Info("serving debug", "address", debugL.Addr().String())
	}
	cfg.Log.Info("serving xDS", "address", xdsL.Addr().String(), "services", cfg.ServicesFile)
	g, ctx := errgroup.WithContext(ctx)
	if caL != nil {
		g.Go(func() error { return serveGRPC(ctx, caL, cfg.Register...) })
		g.Go(func() error { return serveGRPC(ctx, xdsL, s.Register) })
	} else {
		g.Go(func() error { return serveGRPC(ctx, xdsL, append(cfg.Register, s.Register)...) })
	}
	g.Go(func() error { return s.WatchFile(ctx, cfg.ServicesFile) })
	if debugL != nil {
		g.Go(func() error { return serveHTTP(ctx, debugL, s.DebugHandler()) })
	}
	return g.Wait()
}

// Serve serves ADS on l until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	return serveGRPC(ctx, l, s.Register)
}

func closeIf(l net.Listener) error {
	if l == nil {
		return nil
	}
	return l.Close()
}

// serveGRPC serves the services of register on l until ctx ends.
func serveGRPC(ctx context.Context, l net.Listener, register ...func(grpc.ServiceRegistrar)) error {
	g := grpc.NewServer(
		grpc.MaxConcurrentStreams(100000),
		// xDS clients ping every 30 s, as Istio's do; allow it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 15 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	)
	for _, r := range register {
		r(g)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		g.Stop() // xDS streams never end by themselves: a graceful stop would wait forever
	}()
	err := g.Serve(l)
	<-stopped
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve gRPC on %s: %w", l.Addr(), err)
	}
	return nil
}

// WatchFile reloads path whenever it changes until ctx ends. A file that does not parse is
// logged and the last good services stay.
func (s *Server) WatchFile(ctx context.Context, path string) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch services file: %w", err)
	}
	defer w.Close()
	// Watch the directory: editors and kubelet replace files by renaming over them.
	if err := w.Add(filepath.Dir(path)); err != nil {
		return fmt.Errorf("watch services file: %w", err)
	}
	var reload <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-w.Events:
			if filepath.Clean(ev.Name) == filepath.Clean(path) && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename) != 0 {
				reload = time.After(reloadDelay)
			}
		case err := <-w.Errors:
			s.log.Warn("watching services file", "error", err)
		case <-reload:
			reload = nil
			file, err := LoadFile(path)
			if err == nil {
				err = s.UpdateFile(ctx, file)
			}
			if err != nil {
				s.log.Error("reload services, keeping the last good ones", "error", err)
			}
		}
	}
}

// SampleModulePath is where the debug server serves the sample Wasm module (samplewasm), for
// a WasmPlugin of the services file to fetch, as a module server would serve it.
const SampleModulePath = "/wasm/sample.wasm"

// DebugHandler serves /debug/health (the last health report of each client) and
// /debug/nacks (the last rejected responses) as JSON, and the sample Wasm module.
func (s *Server) DebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/health", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.Health()) })
	mux.HandleFunc("GET /debug/nacks", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.NACKs()) })
	module := samplewasm.Module()
	mux.HandleFunc("GET "+SampleModulePath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/wasm")
		_, _ = w.Write(module) // the client went away
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away
}

func serveHTTP(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve debug: %w", err)
	}
	return nil
}
