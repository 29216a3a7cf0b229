package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// statName is how Envoy names a listener in its stats: listener.<address>_<port>.
func statName(a *corev3.SocketAddress) string {
	host := a.GetAddress()
	if strings.Contains(host, ":") {
		host = "[" + strings.ReplaceAll(host, ":", "_") + "]"
	}
	return fmt.Sprintf("listener.%s_%d", host, a.GetPortValue())
}

// serveStaticListeners serves the bootstrap's listeners: an HTTP connection manager routes
// path prefixes to static clusters, as in Istio's bootstrap; any other listener (one added by
// ISTIO_BOOTSTRAP_OVERRIDE, say) holds connections as the LDS listeners do.
func (s *server) serveStaticListeners(ctx context.Context, wg *sync.WaitGroup) error {
	for _, l := range s.bootstrap.GetStaticResources().GetListeners() {
		if !isHTTP(l) {
			tl, err := s.startTCPListener(l)
			if err != nil {
				return fmt.Errorf("static listener %s: %w", l.GetName(), err)
			}
			s.mu.Lock()
			s.listeners["static/"+l.GetName()] = tl
			s.mu.Unlock()
			continue
		}
		h, err := s.routeHandler(l)
		if err != nil {
			return fmt.Errorf("static listener %s: %w", l.GetName(), err)
		}
		addrs := []*corev3.SocketAddress{l.GetAddress().GetSocketAddress()}
		for _, a := range l.GetAdditionalAddresses() {
			addrs = append(addrs, a.GetAddress().GetSocketAddress())
		}
		for _, a := range addrs {
			nl, err := listenTCP(a)
			if err != nil {
				return fmt.Errorf("static listener %s: %w", l.GetName(), err)
			}
			name := statName(a)
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ConnState: func(_ net.Conn, st http.ConnState) {
				switch st {
				case http.StateNew:
					s.stats.add(name+".downstream_cx_active", 1)
					s.stats.add(name+".downstream_cx_total", 1)
				case http.StateClosed, http.StateHijacked:
					s.stats.add(name+".downstream_cx_active", -1)
				}
			}}
			wg.Add(2)
			go func() { defer wg.Done(); srv.Serve(nl) }()
			go func() { defer wg.Done(); <-ctx.Done(); srv.Close() }()
		}
	}
	return nil
}

// isHTTP tells whether a listener's filter is the HTTP connection manager.
func isHTTP(l *listenerv3.Listener) bool {
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			if f.GetTypedConfig().MessageIs(&hcmv3.HttpConnectionManager{}) {
				return true
			}
		}
	}
	return false
}

// routeHandler proxies each route's prefix to its static cluster.
func (s *server) routeHandler(l *listenerv3.Listener) (http.Handler, error) {
	mux := http.NewServeMux()
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			hcm := &hcmv3.HttpConnectionManager{}
			if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
				return nil, fmt.Errorf("filter %s: only the HTTP connection manager is supported: %w", f.GetName(), err)
			}
			for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
				for _, r := range vh.GetRoutes() {
					c := s.staticCluster(r.GetRoute().GetCluster())
					if c == nil {
						return nil, fmt.Errorf("route to unknown cluster %q", r.GetRoute().GetCluster())
					}
					a := endpointAddress(c).GetSocketAddress()
					target := &url.URL{Scheme: "http", Host: net.JoinHostPort(a.GetAddress(), fmt.Sprint(a.GetPortValue()))}
					rp := httputil.NewSingleHostReverseProxy(target)
					rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
						http.Error(w, "upstream connect error or disconnect/reset before headers", http.StatusServiceUnavailable)
					}
					mux.Handle(r.GetMatch().GetPrefix(), rp)
				}
			}
		}
	}
	return mux, nil
}

// tcpListener is an LDS listener: it accepts connections and holds them open (echoing what
// they send) until the client closes them.
type tcpListener struct {
	s       *server
	name    string // the stats name, listener.<address>_<port>
	inbound bool

	mu    sync.Mutex
	l     net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func (s *server) startTCPListener(l *listenerv3.Listener) (*tcpListener, error) {
	a := l.GetAddress().GetSocketAddress()
	nl, err := listenTCP(a)
	if err != nil {
		return nil, err
	}
	t := &tcpListener{s: s, name: statName(a), inbound: l.GetTrafficDirection() == corev3.TrafficDirection_INBOUND, l: nl, conns: map[net.Conn]bool{}}
	s.stats.set(t.name+".downstream_cx_active", 0)
	s.stats.set(t.name+".worker_0.downstream_cx_active", 0)
	t.wg.Add(1)
	go t.accept(nl)
	logf("info", "upstream", "lds: add/update listener '%s' on %s", l.GetName(), nl.Addr())
	return t, nil
}

func (t *tcpListener) accept(nl net.Listener) {
	defer t.wg.Done()
	for {
		c, err := nl.Accept()
		if err != nil {
			return
		}
		t.mu.Lock()
		t.conns[c] = true
		t.mu.Unlock()
		t.count(1)
		t.s.stats.add(t.name+".downstream_cx_total", 1)
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			io.Copy(c, c)
			c.Close()
			t.mu.Lock()
			delete(t.conns, c)
			t.mu.Unlock()
			t.count(-1)
		}()
	}
}

func (t *tcpListener) count(d int64) {
	t.s.stats.add(t.name+".downstream_cx_active", d)
	t.s.stats.add(t.name+".worker_0.downstream_cx_active", d)
}

// stopListening closes the socket; accepted connections stay open.
func (t *tcpListener) stopListening() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.l != nil {
		t.l.Close()
		t.l = nil
	}
}

// close stops listening and closes every connection.
func (t *tcpListener) close() {
	t.stopListening()
	t.mu.Lock()
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
}
