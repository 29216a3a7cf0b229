package prober

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/errgroup"

	"github.com/agentd/agentd/internal/connpass"
)

// Server serves the client connections agentd's status server hands over on the probe
// socket (package connpass): it answers their app probes with its handler, on the client's
// connection, and hands a connection back when a later request on it is for another path.
type Server struct {
	listener net.Listener
	handed   *connpass.Listener
	http     *http.Server
	log      hclog.Logger
}

type handedConnKey struct{}

// NewServer serves probes (an AppProbes) on the connections handed over on l.
func NewServer(l net.Listener, probes http.Handler, log hclog.Logger) *Server {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s := &Server{listener: l, handed: connpass.NewListener(l.Addr()), log: log}
	s.http = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serveHTTP(w, r, probes) }),
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, handedConnKey{}, c)
		},
	}
	return s
}

// Run serves until ctx ends, then lets the answers under way finish (5 s at most).
func (s *Server) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	var (
		mu    sync.Mutex
		links []net.Conn // agentd's connections to the socket, closed at the end
	)
	g.Go(func() error {
		for {
			c, err := s.listener.Accept()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("accept on the probe socket: %w", err)
			}
			uc, ok := c.(*net.UnixConn)
			if !ok {
				_ = c.Close()
				continue
			}
			mu.Lock()
			links = append(links, uc)
			mu.Unlock()
			go func() {
				if err := connpass.ServeFrom(uc, connpass.NewSender(uc), s.handed); err != nil && ctx.Err() == nil {
					s.log.Warn("connection from agentd ended", "error", err)
				}
				_ = uc.Close()
			}()
		}
	})
	g.Go(func() error {
		if err := s.http.Serve(s.handed); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve app probes: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		// The socket is agentd's: closing this process's copy stops Accept, and what arrives
		// later waits in its queue for the next prober.
		_ = s.listener.Close()
		mu.Lock()
		for _, c := range links {
			_ = c.Close()
		}
		mu.Unlock()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return s.http.Shutdown(sctx)
	})
	return g.Wait()
}

// serveHTTP answers app probe paths; a request for another path on a handed-over connection
// goes back to agentd, with its connection, for the status server to answer.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request, probes http.Handler) {
	if isProbePath(r.URL.Path) {
		probes.ServeHTTP(w, r)
		return
	}
	c, ok := r.Context().Value(handedConnKey{}).(*connpass.Conn)
	if !ok {
		probes.ServeHTTP(w, r) // 400: no such probe
		return
	}
	conn, data, err := connpass.Hijack(w, r)
	if err != nil {
		s.log.Error("hand a connection back to agentd", "path", r.URL.Path, "error", err)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	defer conn.Close() // agentd holds its own copy
	if err := c.Back.Send(conn, data); err != nil {
		s.log.Error("hand a connection back to agentd", "path", r.URL.Path, "error", err)
		_, _ = io.WriteString(conn, "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	}
}

// isProbePath: the status port's paths that are the prober's (Istio's prefixes).
func isProbePath(path string) bool {
	return strings.HasPrefix(path, "/app-health/") || strings.HasPrefix(path, "/app-lifecycle/")
}
