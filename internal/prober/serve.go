package prober

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http/httpguts"
	"golang.org/x/sync/errgroup"

	"github.com/agentd/agentd/internal/connpass"
)

// Server serves the client connections agentd's status server hands over on the probe
// socket (package connpass). Each connection's app probes as kubelet sends them (HTTP/1.1
// GET or HEAD, no body, a probe path) are read and answered by a loop of its own (serveConn),
// with net/http's ReadRequest, one after the other, as net/http's server would answer them
// but without its per-request machinery (a goroutine and a read to watch the client, a
// context, deadlines). The first request that is anything else, or that ReadRequest refuses,
// moves the connection, with that request's bytes as they came, to a net/http server
// (slowHTTP), which answers it and what follows as net/http does, and hands the connection
// back to agentd when a request is for another path.
type Server struct {
	listener net.Listener
	probes   http.Handler
	slow     *connpass.Listener
	slowHTTP *http.Server
	log      hclog.Logger

	// ctx is the probes' context: it ends when Run has waited for the answers under way.
	ctx    context.Context
	cancel context.CancelFunc

	closing atomic.Bool
	mu      sync.Mutex
	conns   map[*connpass.Conn]struct{} // in serveConn
	serving sync.WaitGroup              // serveConn loops
}

type handedConnKey struct{}

// Limits of a request read by serveConn, as net/http's server's defaults.
const (
	readHeaderTimeout = 10 * time.Second
	maxHeaderBytes    = http.DefaultMaxHeaderBytes + 4096
)

// NewServer serves probes (an AppProbes) on the connections handed over on l.
func NewServer(l net.Listener, probes http.Handler, log hclog.Logger) *Server {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s := &Server{listener: l, probes: probes, slow: connpass.NewListener(l.Addr()), log: log,
		conns: map[*connpass.Conn]struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.slowHTTP = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serveHTTP(w, r, probes) }),
		ReadHeaderTimeout: readHeaderTimeout,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, handedConnKey{}, c)
		},
	}
	return s
}

// Run serves until ctx ends, then lets the answers under way finish (5 s at most).
func (s *Server) Run(ctx context.Context) error {
	defer s.cancel()
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
				if err := s.receive(uc); err != nil && ctx.Err() == nil {
					s.log.Warn("connection from agentd ended", "error", err)
				}
				_ = uc.Close()
			}()
		}
	})
	g.Go(func() error {
		if err := s.slowHTTP.Serve(s.slow); !errors.Is(err, http.ErrServerClosed) {
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
		s.stopConns()
		err := s.slowHTTP.Shutdown(sctx)
		done := make(chan struct{})
		go func() {
			s.serving.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-sctx.Done():
			err = errors.Join(err, fmt.Errorf("app probes still under way: %w", sctx.Err()))
		}
		return err
	})
	return g.Wait()
}

// receive serves every connection agentd hands over on uc until uc fails or closes.
func (s *Server) receive(uc *net.UnixConn) error {
	back := connpass.NewSender(uc)
	for {
		c, err := connpass.Receive(uc, back)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if !s.track(c) {
			_ = c.Close()
			continue
		}
		go s.serveConn(c)
	}
}

// track counts c in, unless the server is stopping.
func (s *Server) track(c *connpass.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	s.serving.Add(1)
	return true
}

func (s *Server) untrack(c *connpass.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.serving.Done()
}

// stopConns makes serveConn's loops end: a connection waiting for a request ends at once,
// one with a probe under way after its answer.
func (s *Server) stopConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing.Store(true)
	for c := range s.conns {
		_ = c.SetReadDeadline(aLongTimeAgo)
	}
}

// readers are serveConn's request readers, reused across connections: kubelet makes a
// connection per probe.
var readers = sync.Pool{New: func() any { return &requestReader{br: bufio.NewReaderSize(nil, 4<<10)} }}

// requestReader reads a connection's requests and keeps the bytes of the one being read (its
// head, and what was read past it), so that a request serveConn does not answer goes to
// net/http's server as it came, byte for byte, for net/http to read and judge.
type requestReader struct {
	br       *bufio.Reader
	lr       io.LimitedReader // the header's size limit
	recorded []byte
}

func (r *requestReader) Read(p []byte) (int, error) {
	n, err := r.lr.Read(p)
	r.recorded = append(r.recorded, p[:n]...)
	return n, err
}

// next reads the next request; recorded is then its bytes as they came and those read
// past it.
func (r *requestReader) next() (req *http.Request, tooLarge bool, err error) {
	buffered, _ := r.br.Peek(r.br.Buffered())
	r.recorded = append(r.recorded[:0], buffered...)
	r.lr.N = maxHeaderBytes
	req, err = http.ReadRequest(r.br)
	tooLarge = r.lr.N == 0
	r.lr.N = math.MaxInt64
	return req, tooLarge, err
}

// serveConn answers c's app probes until the client closes it or asks to, the server stops,
// or a request is one for slowHTTP (anything else, or one it cannot read).
func (s *Server) serveConn(c *connpass.Conn) {
	moved := false
	rr := readers.Get().(*requestReader)
	rr.lr.R, rr.lr.N = c, math.MaxInt64
	rr.br.Reset(rr)
	defer func() {
		rr.br.Reset(nil)
		rr.lr.R = nil
		rr.recorded = rr.recorded[:0]
		readers.Put(rr)
		if !moved {
			_ = c.Close()
		}
		s.untrack(c)
	}()
	for !s.closing.Load() {
		// No deadline while waiting for a request, as net/http's server without an idle
		// timeout; the header's starts with its first byte.
		if _, err := rr.br.Peek(1); err != nil {
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(readHeaderTimeout))
		req, tooLarge, err := rr.next()
		if err != nil && (tooLarge || quietReadError(err)) {
			if tooLarge { // as net/http's server answers it
				const tooLarge = "431 Request Header Fields Too Large"
				_, _ = io.WriteString(c, "HTTP/1.1 "+tooLarge+"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"+tooLarge)
			}
			return
		}
		_ = c.SetReadDeadline(time.Time{})
		if err != nil || !plainProbe(req) {
			// net/http reads it again, answers it (400, 501, 505 for what it refuses) and
			// serves the connection from then on.
			s.slow.Put(c.Unread(slices.Clone(rr.recorded)))
			moved = true
			return
		}
		if !s.answer(c, req) {
			return
		}
	}
}

// quietReadError: the client went away or was too slow, which net/http's server does not answer.
func quietReadError(err error) bool {
	var (
		ne net.Error
		oe *net.OpError
	)
	return err == io.EOF || errors.As(err, &ne) && ne.Timeout() || errors.As(err, &oe) && oe.Op == "read"
}

// plainProbe reports whether r is an app probe as kubelet sends it, which serveConn answers
// itself: HTTP/1.1, GET or HEAD, no body, no Expect, the request target a path, and a Host and
// header fields that net/http's server takes (it answers others with 400).
func plainProbe(r *http.Request) bool {
	if r.ProtoMajor != 1 || r.ProtoMinor != 1 || (r.Method != http.MethodGet && r.Method != http.MethodHead) ||
		r.ContentLength != 0 || len(r.TransferEncoding) > 0 || r.Header["Expect"] != nil ||
		!strings.HasPrefix(r.RequestURI, "/") || !isProbePath(r.URL.Path) ||
		r.Host == "" || !httpguts.ValidHostHeader(r.Host) {
		return false
	}
	for k, vv := range r.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	return true
}

// answer runs the probe of req and writes its answer to c; false when c is to be closed
// (the client asked to, or the answer could not be written).
func (s *Server) answer(c net.Conn, req *http.Request) bool {
	w := answers.Get().(*answerWriter)
	defer answers.Put(w)
	w.reset()
	s.probes.ServeHTTP(w, req.WithContext(s.ctx))
	closeAfter := req.Close
	_, err := c.Write(w.wire(req, closeAfter))
	return err == nil && !closeAfter
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
