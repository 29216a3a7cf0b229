package prober

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	networking "istio.io/api/networking/v1alpha3"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// healthUserAgent is what Istio's WorkloadEntry health probes send unless told otherwise.
const healthUserAgent = "istio-probe/1.0"

// HealthCheck is Istio's WorkloadEntry health check (ProxyConfig readinessProbe): it probes
// the workload every Period and reports a change of state once SuccessThreshold consecutive
// successes or FailureThreshold consecutive failures are seen. The first crossing of either
// threshold always reports.
type HealthCheck struct {
	InitialDelay     time.Duration
	Period           time.Duration
	Timeout          time.Duration
	SuccessThreshold int
	FailureThreshold int
	// Probe returns nil when the workload is healthy; its context carries Timeout.
	Probe func(ctx context.Context) error
}

// HealthOptions are what a HealthCheck needs besides the readinessProbe itself.
type HealthOptions struct {
	Host          string       // default host of HTTP, TCP and gRPC checks (the pod IP, or localhost)
	Source        *net.TCPAddr // source address of HTTP and gRPC checks (127.0.0.6 or ::6)
	AgentReadyURL string       // when set, it must answer 200 before the workload is probed
}

// NewHealthCheck builds the check for cfg with Istio's defaults: thresholds 1, timeout 1 s,
// period 10 s, HTTP path "/" and scheme http.
func NewHealthCheck(cfg *networking.ReadinessProbe, o HealthOptions) (*HealthCheck, error) {
	if o.Host == "" {
		o.Host = "localhost"
	}
	if o.Source == nil {
		o.Source = sourceIPv4
	}
	h := &HealthCheck{
		InitialDelay:     time.Duration(cfg.GetInitialDelaySeconds()) * time.Second,
		Period:           time.Duration(orDefault(cfg.GetPeriodSeconds(), 10)) * time.Second,
		Timeout:          time.Duration(orDefault(cfg.GetTimeoutSeconds(), 1)) * time.Second,
		SuccessThreshold: int(orDefault(cfg.GetSuccessThreshold(), 1)),
		FailureThreshold: int(orDefault(cfg.GetFailureThreshold(), 1)),
	}
	var probe func(context.Context) error
	switch m := cfg.GetHealthCheckMethod().(type) {
	case *networking.ReadinessProbe_HttpGet:
		probe = httpHealthProbe(m.HttpGet, o)
	case *networking.ReadinessProbe_TcpSocket:
		probe = tcpHealthProbe(m.TcpSocket, o)
	case *networking.ReadinessProbe_Grpc:
		probe = grpcHealthProbe(m.Grpc, o)
	case *networking.ReadinessProbe_Exec:
		if len(m.Exec.GetCommand()) == 0 {
			return nil, errors.New("readinessProbe exec: empty command")
		}
		probe = execHealthProbe(m.Exec.GetCommand())
	default:
		return nil, errors.New("readinessProbe: no httpGet, tcpSocket, grpc or exec health check")
	}
	h.Probe = probe
	if o.AgentReadyURL != "" {
		h.Probe = func(ctx context.Context) error {
			if err := agentReady(ctx, o.AgentReadyURL); err != nil {
				return err
			}
			return probe(ctx)
		}
	}
	return h, nil
}

func orDefault(v, def int32) int32 {
	if v <= 0 {
		return def
	}
	return v
}

// Run probes until ctx ends and calls publish with each change of state. A change that could
// not be published is tried again after each later probe until it is.
func (h *HealthCheck) Run(ctx context.Context, log hclog.Logger, publish func(context.Context, *agentv1.WorkloadHealth) error) error {
	log.Info("starting workload health check", "initial_delay", h.InitialDelay, "period", h.Period)
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(h.InitialDelay):
	}
	t := &thresholds{success: h.SuccessThreshold, failure: h.FailureThreshold}
	var pending *agentv1.WorkloadHealth
	check := func() {
		pctx, cancel := context.WithTimeout(ctx, h.Timeout)
		err := h.Probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if ev := t.observe(err); ev != nil {
			log.Info("workload health changed", "healthy", ev.GetHealthy(), "reason", ev.GetMessage())
			pending = ev
		}
		if pending != nil {
			if err := publish(ctx, pending); err != nil {
				log.Warn("publish workload health", "error", err)
				return
			}
			pending = nil
		}
	}
	check()
	ticker := time.NewTicker(h.Period)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			check()
		}
	}
}

// thresholds is the health state machine: it turns probe results into state changes.
type thresholds struct {
	success, failure    int
	numSuccess, numFail int
	state               int // 0 undefined, 1 healthy, 2 unhealthy
}

const (
	stateHealthy   = 1
	stateUnhealthy = 2
)

// observe records one probe result and returns the event to report, or nil.
func (t *thresholds) observe(err error) *agentv1.WorkloadHealth {
	if err == nil {
		t.numSuccess++
		t.numFail = 0
		if t.numSuccess >= t.success && t.state != stateHealthy {
			t.numSuccess, t.state = 0, stateHealthy
			return &agentv1.WorkloadHealth{Healthy: true}
		}
		return nil
	}
	t.numFail++
	t.numSuccess = 0
	if t.numFail >= t.failure && t.state != stateUnhealthy {
		t.numFail, t.state = 0, stateUnhealthy
		return &agentv1.WorkloadHealth{Healthy: false, Message: err.Error()}
	}
	return nil
}

func httpHealthProbe(cfg *networking.HTTPHealthCheckConfig, o HealthOptions) func(context.Context) error {
	scheme := strings.ToLower(cfg.GetScheme())
	if scheme == "" {
		scheme = "http"
	}
	host := cfg.GetHost()
	if host == "" {
		host = o.Host
	}
	target, err := url.Parse(cfg.GetPath())
	if err != nil {
		target = &url.URL{Path: cfg.GetPath()}
	}
	if target.Path == "" {
		target.Path = "/"
	}
	target.Scheme = scheme
	target.Host = net.JoinHostPort(host, strconv.Itoa(int(cfg.GetPort())))
	headers := http.Header{}
	for _, h := range cfg.GetHttpHeaders() {
		headers.Add(h.GetName(), h.GetValue())
	}
	if headers.Get("User-Agent") == "" {
		headers.Set("User-Agent", healthUserAgent)
	}
	client := &http.Client{
		Transport: &http.Transport{
			DialContext:       probeDialer(o.Source, 0).DialContext,
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as Istio and kubelet
		},
		CheckRedirect: sameHostRedirects,
	}
	u := target.String()
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return fmt.Errorf("health check request %s: %w", u, err)
		}
		req.Header = headers.Clone()
		if h := headers.Get("Host"); h != "" {
			req.Host = h
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody))
		_ = resp.Body.Close()
		if resp.StatusCode < http.StatusOK || resp.StatusCode >= http.StatusBadRequest {
			return fmt.Errorf("status code was not from [200,400), bad code %v", resp.StatusCode)
		}
		return nil
	}
}

func tcpHealthProbe(cfg *networking.TCPHealthCheckConfig, o HealthOptions) func(context.Context) error {
	host := cfg.GetHost()
	if host == "" {
		host = o.Host
	}
	addr := net.JoinHostPort(host, strconv.Itoa(int(cfg.GetPort())))
	return func(ctx context.Context) error {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
}

func grpcHealthProbe(cfg *networking.GrpcHealthCheckConfig, o HealthOptions) func(context.Context) error {
	addr := net.JoinHostPort(o.Host, strconv.Itoa(int(cfg.GetPort())))
	return func(ctx context.Context) error {
		return grpcHealthCheck(ctx, addr, cfg.GetService(), healthUserAgent, o.Source, 0)
	}
}

func execHealthProbe(command []string) func(context.Context) error {
	return func(ctx context.Context) error {
		cmd := exec.CommandContext(ctx, command[0], command[1:]...)
		if err := cmd.Run(); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("command timeout exceeded: %v", err)
			}
			return err
		}
		return nil
	}
}

func agentReady(ctx context.Context, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("agent readiness request %s: %w", u, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("agent readiness: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent is not ready: %s answered %d", u, resp.StatusCode)
	}
	return nil
}
