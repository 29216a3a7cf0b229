// Package probeapp is the application the probes compatibility case probes, as the one the
// reference recording of Istio's pilot-agent probed: HTTP on 18080 and 18082, a TCP port that
// accepts and closes on 18081, HTTPS with a self-signed certificate and HTTP/2 on 18083, gRPC
// health on 18090 ("" and "ready" SERVING, "notready" NOT_SERVING) and a gRPC server without
// the health service on 18091. It records what it saw of every request (the events a probe
// caused), so that a test can say what reached the app.
package probeapp

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The app's ports, those of the recorded probers.
const (
	HTTPPort         = 18080
	TCPPort          = 18081
	HTTPOtherPort    = 18082
	HTTPSPort        = 18083
	GRPCPort         = 18090
	GRPCNoHealthPort = 18091
)

// Event is one request as the app saw it.
type Event struct {
	Kind    string // http, tcp or grpc
	Peer    string // the source IP
	Port    int    // the app's port (http, tcp)
	Proto   string // http
	Method  string // http
	URI     string // http: the request URI as sent
	UA      string // http, grpc: the user agent
	Service string // grpc: the service asked about
}

// String is the event as the recording writes it.
func (e Event) String() string {
	switch e.Kind {
	case "tcp":
		return fmt.Sprintf("tcp %s :%d", e.Peer, e.Port)
	case "grpc":
		return fmt.Sprintf("grpc %s service=%q ua=%q", e.Peer, e.Service, e.UA)
	default:
		return fmt.Sprintf("http %s :%d %s %s %s ua=%q", e.Peer, e.Port, e.Proto, e.Method, e.URI, e.UA)
	}
}

// App is the running app.
type App struct {
	mu     sync.Mutex
	events []Event
}

// Listen opens a TCP listener on addr (the test's opens it in the agent's network namespace).
type Listen func(addr string) (net.Listener, error)

// Events returns what the app saw since the last Reset, in order.
func (a *App) Events() []Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.events)
}

// Reset forgets the events seen so far.
func (a *App) Reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = nil
}

func (a *App) record(e Event) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, e)
}

// Run serves every port until ctx ends.
func Run(ctx context.Context, listen Listen, ready func(*App)) error {
	a := &App{}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	open := func(port int) (net.Listener, error) {
		l, err := listen(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return nil, fmt.Errorf("listen on %d: %w", port, err)
		}
		ls = append(ls, l)
		return l, nil
	}
	cert, err := selfSigned()
	if err != nil {
		return err
	}
	quiet := log.New(io.Discard, "", 0)
	var servers []func() error
	for _, port := range []int{HTTPPort, HTTPOtherPort} {
		l, err := open(port)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: a.handler(port), ErrorLog: quiet}
		servers = append(servers, func() error { return srv.Serve(l) })
		defer srv.Close()
	}
	tl, err := open(HTTPSPort)
	if err != nil {
		return err
	}
	tlsSrv := &http.Server{Handler: a.handler(HTTPSPort), ErrorLog: quiet,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	servers = append(servers, func() error { return tlsSrv.ServeTLS(tl, "", "") }) // offers h2
	defer tlsSrv.Close()
	tcp, err := open(TCPPort)
	if err != nil {
		return err
	}
	servers = append(servers, func() error { return a.acceptAndClose(tcp) })
	for _, port := range []int{GRPCPort, GRPCNoHealthPort} {
		l, err := open(port)
		if err != nil {
			return err
		}
		g := grpc.NewServer()
		if port == GRPCPort {
			healthpb.RegisterHealthServer(g, &health{app: a})
		}
		servers = append(servers, func() error { return g.Serve(l) })
		defer g.Stop()
	}
	errc := make(chan error, len(servers))
	for _, serve := range servers {
		go func() { errc <- serve() }()
	}
	ready(a)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return fmt.Errorf("probe app: %w", err)
	}
}

// handler records each request, then answers /status/N, /redirect, /loop, /echo, /slow, /big.
func (a *App) handler(port int) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/status/{code}", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.PathValue("code"))
		if err != nil || code < 100 || code > 999 {
			http.Error(w, "bad status", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(code)
		fmt.Fprintf(w, "status %d\n", code)
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.URL.Query().Get("code"))
		if err != nil || code < 300 || code > 399 {
			http.Error(w, "bad code", http.StatusBadRequest)
			return
		}
		if to := r.URL.Query().Get("to"); to != "" {
			w.Header().Set("Location", to)
		}
		w.WriteHeader(code)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Location", "/loop")
		w.WriteHeader(http.StatusFound)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		peerIP, _, _ := net.SplitHostPort(r.RemoteAddr)
		var b strings.Builder
		fmt.Fprintf(&b, "proto=%s method=%s uri=%s host=%s peer=%s", r.Proto, r.Method, r.RequestURI, r.Host, peerIP)
		if r.TLS != nil {
			fmt.Fprintf(&b, " sni=%q", r.TLS.ServerName)
		}
		b.WriteString("\n")
		for _, name := range slices.Sorted(maps.Keys(r.Header)) {
			for _, v := range r.Header[name] {
				fmt.Fprintf(&b, "%s: %s\n", name, v)
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, b.String())
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		ms, err := strconv.Atoi(r.URL.Query().Get("ms"))
		if err != nil || ms < 0 || ms > 60_000 {
			http.Error(w, "bad ms", http.StatusBadRequest)
			return
		}
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-r.Context().Done(): // the prober gave up
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "slow %d\n", ms)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 0 || n > 1<<20 {
			http.Error(w, "bad n", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		line := []byte("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n")
		for n > 0 {
			k := min(n, len(line))
			w.Write(line[:k])
			n -= k
		}
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peerIP, _, _ := net.SplitHostPort(r.RemoteAddr)
		a.record(Event{Kind: "http", Peer: peerIP, Port: port, Proto: r.Proto, Method: r.Method,
			URI: r.RequestURI, UA: r.Header.Get("User-Agent")})
		mux.ServeHTTP(w, r)
	})
}

func (a *App) acceptAndClose(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		peerIP, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		a.record(Event{Kind: "tcp", Peer: peerIP, Port: TCPPort})
		c.Close()
	}
}

// health is grpc.health.v1.Health: "" and "ready" SERVING, "notready" NOT_SERVING, any other
// service NOT_FOUND, as grpc-go's own health server answers an unknown service.
type health struct {
	healthpb.UnimplementedHealthServer
	app *App
}

func (h *health) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	e := Event{Kind: "grpc", Service: req.GetService()}
	if p, ok := peer.FromContext(ctx); ok {
		e.Peer, _, _ = net.SplitHostPort(p.Addr.String())
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		e.UA = strings.Join(md.Get("user-agent"), ",")
	}
	h.app.record(e)
	switch req.GetService() {
	case "", "ready":
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	case "notready":
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	return nil, status.Error(codes.NotFound, "unknown service")
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate the app's key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "probe-app"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-sign the app's certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
