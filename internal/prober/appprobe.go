package prober

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentd/agentd/internal/kubeprobe"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/agentd/agentd/internal/httpgz"
)

// maxProbeBody is how much of the app's answer a probe passes back (Istio: 10 KiB).
const maxProbeBody = 10 << 10

// Probe source addresses: probes leave from these so that the sidecar's iptables rules
// let them reach the app directly (Istio's UpstreamLocalAddress).
var (
	sourceIPv4 = &net.TCPAddr{IP: net.ParseIP("127.0.0.6")}
	sourceIPv6 = &net.TCPAddr{IP: net.ParseIP("::6")}
)

// AppProbeOptions configures AppProbes. The zero value answers 400 to every path.
type AppProbeOptions struct {
	Probes          map[string]*kubeprobe.KubeProbe // from kubeprobe.ParseKubeProbes
	PodIP           string                          // destination; empty means localhost
	LegacyLocalhost bool                            // REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION: always localhost
	IPv6            bool                            // the proxy is IPv6-only: leave from ::6
	StatusPort      int                             // an incoming Host with this port gets the app's port
	DisableHTTP2    bool                            // no HTTP/2 for HTTPS probes (ISTIO_ENABLE_HTTP2_PROBING=false)
	KeepAlive       bool                            // ENABLE_PROBE_KEEPALIVE_CONNECTIONS
	Log             hclog.Logger                    // probe failures (Istio's "probes" scope); default: none
	Observe         func(kind string, ok bool)
}

// AppProbes answers the rewritten kubelet probes (/app-health/<c>/livez, ...) by running the
// original probe against the app with kubelet's semantics, as Istio's status server does.
type AppProbes struct {
	probes      map[string]*kubeprobe.KubeProbe
	clients     map[string]*http.Client // one per httpGet probe, as Istio
	dest        string
	source      *net.TCPAddr
	statusPort  int
	keepAlive   bool        // ENABLE_PROBE_KEEPALIVE_CONNECTIONS: pooled connections, net/http's way
	plainDialer *net.Dialer // plain-HTTP probes without keep-alive (plainDo)
	log         hclog.Logger
	observe     func(kind string, ok bool)
}

// NewAppProbes builds the handler and one HTTP client per httpGet probe.
func NewAppProbes(o AppProbeOptions) *AppProbes {
	a := &AppProbes{
		probes:     o.Probes,
		clients:    map[string]*http.Client{},
		dest:       o.PodIP,
		source:     sourceIPv4,
		statusPort: o.StatusPort,
		keepAlive:  o.KeepAlive,
		log:        o.Log,
		observe:    o.Observe,
	}
	if ip := net.ParseIP(o.PodIP); o.IPv6 || (ip != nil && ip.To4() == nil && !ip.IsLinkLocalUnicast()) {
		a.source = sourceIPv6
	}
	a.plainDialer = plainProbeDialer(a.source)
	if o.LegacyLocalhost || a.dest == "" {
		a.dest = "localhost"
	}
	if a.log == nil {
		a.log = hclog.NewNullLogger()
	}
	if a.observe == nil {
		a.observe = func(string, bool) {}
	}
	for path, p := range o.Probes {
		if p.HTTPGet != nil {
			a.clients[path] = a.httpClient(p, o)
		}
	}
	return a
}

func (a *AppProbes) httpClient(p *kubeprobe.KubeProbe, o AppProbeOptions) *http.Client {
	d := probeDialer(a.source, 0)
	t := &http.Transport{
		DialContext: d.DialContext,
		// As kubelet: no certificate verification, and no keep-alive so that idle timeouts
		// never fail a probe.
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // kubelet semantics
		DisableKeepAlives:   !o.KeepAlive,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
	}
	if !o.DisableHTTP2 {
		t.ForceAttemptHTTP2 = true
		t.HTTP2 = &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second}
	}
	return &http.Client{
		Timeout:       time.Duration(p.TimeoutSeconds) * time.Second,
		Transport:     t,
		CheckRedirect: sameHostRedirects,
	}
}

// sameHostRedirects is kubelet's redirect rule: follow redirects to the same host, at most 10;
// a redirect to another host is not followed and the 3xx answer counts as success.
func sameHostRedirects(req *http.Request, via []*http.Request) error {
	if req.URL.Hostname() != via[0].URL.Hostname() {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

// probeDialer dials from the probe source address with SO_LINGER 1 s, as Istio, so that
// frequent probes do not pile up sockets in TIME_WAIT. IP_BIND_ADDRESS_NO_PORT lets the kernel
// pick the source port at connect time, as for an unbound socket, instead of searching for a
// port free for every destination at bind time.
func probeDialer(source *net.TCPAddr, timeout time.Duration) *net.Dialer {
	return &net.Dialer{
		LocalAddr: source,
		Timeout:   timeout,
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = errors.Join(
					unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 1}),
					unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1))
			})
			if err != nil {
				return err
			}
			return serr
		},
	}
}

// ServeHTTP answers one probe path: the app's status (3xx becomes 200) and up to 10 KiB of its
// body for httpGet, 200 or 500 for tcpSocket and grpc, 500 when the probe could not be run, and
// 400 for a path with no probe. A body of 1 KiB or more goes gzipped to a client that accepts
// it, as Istio's status port sends it.
func (a *AppProbes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	p, ok := a.probes[path]
	if !ok {
		a.log.Error("prober does not exist", "path", path)
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, "app prober config does not exists for %v", path)
		return
	}
	var (
		kind string
		code int
		body []byte
	)
	switch {
	case p.HTTPGet != nil:
		kind = "http"
		code, body = a.probeHTTP(r, path, p.HTTPGet, a.clients[path])
	case p.TCPSocket != nil:
		kind = "tcp"
		code = a.probeTCP(r.Context(), p)
	case p.GRPC != nil:
		kind = "grpc"
		code = a.probeGRPC(r, p)
	}
	a.observe(kind, code < http.StatusBadRequest)
	httpgz.Write(w, r, code, body)
}

func (a *AppProbes) probeHTTP(in *http.Request, path string, g *kubeprobe.HTTPGetAction, client *http.Client) (int, []byte) {
	appPath := g.Path
	if !strings.HasPrefix(appPath, "/") {
		appPath = "/" + appPath
	}
	scheme := "http"
	if strings.EqualFold(g.Scheme, "https") {
		scheme = "https"
	}
	port := strconv.Itoa(g.Port.Int)
	url := scheme + "://" + net.JoinHostPort(a.dest, port) + appPath
	req, err := http.NewRequestWithContext(in.Context(), http.MethodGet, url, nil)
	if err != nil {
		a.log.Error("build app probe request", "path", path, "url", url, "error", err)
		return http.StatusInternalServerError, nil
	}
	req.Host = in.Host
	if host, p, err := net.SplitHostPort(in.Host); err == nil && p == strconv.Itoa(a.statusPort) {
		req.Host = net.JoinHostPort(host, port)
	}
	if in.Header != nil {
		req.Header = in.Header.Clone()
	}
	if host := req.Header["Host"]; len(host) > 0 {
		req.Host = host[0]
	}
	var resp *http.Response
	if scheme == "http" && !a.keepAlive {
		resp, err = a.plainDo(req, client)
	} else {
		resp, err = client.Do(req)
	}
	if err != nil {
		a.log.Error("request to probe app failed", "path", path, "app_path", appPath, "error", err)
		return http.StatusInternalServerError, nil
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode >= http.StatusMultipleChoices && resp.StatusCode < http.StatusBadRequest {
		// A redirect that was not followed (another host): success, without the Location.
		return http.StatusOK, nil
	}
	return resp.StatusCode, readBody(resp)
}

func (a *AppProbes) probeTCP(ctx context.Context, p *kubeprobe.KubeProbe) int {
	d := probeDialer(a.source, time.Duration(p.TimeoutSeconds)*time.Second)
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(a.dest, strconv.Itoa(p.TCPSocket.Port.Int)))
	if err != nil {
		a.log.Error("tcp probe failed", "port", p.TCPSocket.Port.Int, "error", err)
		return http.StatusInternalServerError
	}
	_ = conn.Close()
	return http.StatusOK
}

func (a *AppProbes) probeGRPC(in *http.Request, p *kubeprobe.KubeProbe) int {
	var service string
	if p.GRPC.Service != nil {
		service = *p.GRPC.Service
	}
	addr := net.JoinHostPort(a.dest, strconv.Itoa(int(p.GRPC.Port)))
	err := grpcHealthCheck(in.Context(), addr, service, in.Header.Get("User-Agent"), a.source,
		time.Duration(p.TimeoutSeconds)*time.Second)
	if err != nil {
		a.log.Error("grpc probe failed", "addr", addr, "error", err)
		return http.StatusInternalServerError
	}
	return http.StatusOK
}

// grpcHealthCheck runs grpc.health.v1.Health/Check and returns nil only for SERVING. A zero
// timeout means none besides ctx's. The call waits for the connection until the timeout, as
// Istio's blocking dial does: an app that is not listening yet fails the probe after
// timeoutSeconds, not at once.
func grpcHealthCheck(ctx context.Context, addr, service, userAgent string, source *net.TCPAddr, timeout time.Duration) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	d := probeDialer(source, timeout)
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}),
	}
	if userAgent != "" {
		opts = append(opts, grpc.WithUserAgent(userAgent))
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return fmt.Errorf("grpc connection to %s: %w", addr, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	switch grpcstatus.Code(err) {
	case codes.OK:
	case codes.Unimplemented:
		return fmt.Errorf("server does not implement the grpc health protocol (grpc.health.v1.Health): %w", err)
	case codes.DeadlineExceeded:
		return fmt.Errorf("grpc request not finished within timeout: %w", err)
	default:
		return fmt.Errorf("grpc probe failed: %w", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("grpc service %q is %v", service, resp.GetStatus())
	}
	return nil
}
