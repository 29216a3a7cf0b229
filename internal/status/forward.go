package status

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agentd/agentd/internal/connpass"
)

// ProbeForwarder hands app probe connections to the prober helper: the status server reads
// kubelet's request, then passes the client connection itself, with the request, over the
// prober's Unix socket (agentd's socket "probe"), and the prober answers kubelet directly,
// on that connection, from then on. agentd is out of the way after one request: no second HTTP
// exchange, no copy of the answer. A later request on that connection for another path comes
// back (the prober hands the connection back) and is served here as any other. A prober that
// cannot be reached gives 500, as a probe that cannot be run does.
type ProbeForwarder struct {
	path string
	log  hclog.Logger

	mu     sync.Mutex
	sender *connpass.Sender // nil until dialled, and after a failed send
}

// NewProbeForwarder hands app probes to the prober listening on the Unix socket at path.
func NewProbeForwarder(path string, log hclog.Logger) *ProbeForwarder {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &ProbeForwarder{path: path, log: log}
}

// ServeHTTP hands the request's connection to the prober.
func (f *ProbeForwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sender, err := f.dial(r.Context())
	if err != nil {
		f.log.Error("forward app probe to the prober", "path", r.URL.Path, "error", err)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	conn, data, err := connpass.Hijack(w, r)
	if err != nil {
		f.log.Error("forward app probe to the prober", "path", r.URL.Path, "error", err)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	defer conn.Close() // the prober holds its own copy
	err = sender.Send(conn, data)
	if err != nil {
		// The prober restarted: its old connection is gone, the socket (agentd's) is not.
		f.drop(sender)
		if sender, err = f.dial(r.Context()); err == nil {
			err = sender.Send(conn, data)
		}
	}
	if err != nil {
		f.drop(sender)
		f.log.Error("forward app probe to the prober", "path", r.URL.Path, "error", err)
		_, _ = io.WriteString(conn, "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	}
}

// dial returns the connection to the prober, dialling it when there is none. Connections the
// prober hands back are served by the server that r came to.
func (f *ProbeForwarder) dial(ctx context.Context) (*connpass.Sender, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sender != nil {
		return f.sender, nil
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "unix", f.path)
	if err != nil {
		return nil, fmt.Errorf("dial the prober: %w", err)
	}
	uc := c.(*net.UnixConn)
	f.sender = connpass.NewSender(uc)
	if srv, ok := ctx.Value(http.ServerContextKey).(*http.Server); ok {
		go f.serveBack(uc, f.sender, srv)
	}
	return f.sender, nil
}

// serveBack serves the connections the prober hands back with the status server's handler,
// until the Unix connection ends.
func (f *ProbeForwarder) serveBack(uc *net.UnixConn, sender *connpass.Sender, srv *http.Server) {
	l := connpass.NewListener(uc.LocalAddr())
	back := &http.Server{Handler: srv.Handler, ReadHeaderTimeout: srv.ReadHeaderTimeout, ReadTimeout: srv.ReadTimeout,
		WriteTimeout: srv.WriteTimeout, IdleTimeout: srv.IdleTimeout, ErrorLog: srv.ErrorLog}
	go func() { _ = back.Serve(l) }()
	if err := connpass.ServeFrom(uc, sender, l); err != nil && !errors.Is(err, net.ErrClosed) {
		f.log.Debug("connection to the prober ended", "error", err)
	}
	f.drop(sender)
	_ = l.Close()
	// Connections served here end when their clients close them; none is cut.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = back.Shutdown(ctx)
	}()
}

// drop forgets sender (closing it) if it is still the current one.
func (f *ProbeForwarder) drop(sender *connpass.Sender) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sender == sender {
		f.sender = nil
	}
	_ = sender.Close()
}
