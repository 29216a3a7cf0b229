package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Admin is a client of Envoy's admin API.
type Admin struct {
	base   string
	client *http.Client
}

// NewAdmin returns a client of the admin API at host:port.
func NewAdmin(host string, port int) *Admin {
	return &Admin{
		base:   "http://" + net.JoinHostPort(host, strconv.Itoa(port)),
		client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
	}
}

// Stat is one line of /stats: a counter's or gauge's name and value.
type Stat struct {
	Name  string
	Value string
}

// Uint is the value as an integer; histograms and text values are not.
func (s Stat) Uint() (uint64, bool) {
	v, err := strconv.ParseUint(s.Value, 10, 64)
	return v, err == nil
}

// Stats is GET /stats?usedonly&filter=<regex>, parsed.
func (a *Admin) Stats(ctx context.Context, filter string) ([]Stat, error) {
	body, err := a.do(ctx, http.MethodGet, "/stats?usedonly&filter="+url.QueryEscape(filter), http.StatusOK)
	if err != nil {
		return nil, err
	}
	return ParseStats(body), nil
}

// ParseStats parses Envoy's text stats: "name: value" lines; others are skipped.
func ParseStats(body []byte) []Stat {
	var stats []Stat
	for _, line := range strings.Split(string(body), "\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" {
			continue
		}
		stats = append(stats, Stat{Name: strings.TrimSpace(name), Value: strings.TrimSpace(value)})
	}
	return stats
}

// Ready is GET /ready: nil when Envoy answers LIVE, else an error with the state it reports.
func (a *Admin) Ready(ctx context.Context) error {
	body, err := a.do(ctx, http.MethodGet, "/ready", 0)
	if err != nil {
		return err
	}
	if state := strings.TrimSpace(string(body)); state != "LIVE" {
		return fmt.Errorf("envoy is %s", state)
	}
	return nil
}

// DrainListeners is POST /drain_listeners?[inboundonly&]graceful[&skip_exit]. Sidecars drain
// only inbound listeners, gateways all; skipExit keeps Envoy running after the drain time.
func (a *Admin) DrainListeners(ctx context.Context, inboundOnly, skipExit bool) error {
	path := "/drain_listeners?graceful"
	if inboundOnly {
		path = "/drain_listeners?inboundonly&graceful"
	}
	if skipExit {
		path += "&skip_exit"
	}
	_, err := a.do(ctx, http.MethodPost, path, http.StatusOK)
	return err
}

// Quit is POST /quitquitquit: Envoy exits cleanly at once.
func (a *Admin) Quit(ctx context.Context) error {
	_, err := a.do(ctx, http.MethodPost, "/quitquitquit", http.StatusOK)
	return err
}

// ServerInfo is the part of Envoy's /server_info that agentd reads. It is decoded with
// encoding/json rather than into go-control-plane's admin types, which agentd does not link.
type ServerInfo struct {
	Version            string             `json:"version"`
	State              string             `json:"state"` // LIVE, DRAINING, PRE_INITIALIZING, INITIALIZING
	Node               ServerNode         `json:"node"`
	CommandLineOptions CommandLineOptions `json:"command_line_options"`
}

// ServerNode is the node Envoy runs as: the bootstrap's.
type ServerNode struct {
	ID      string `json:"id"`
	Cluster string `json:"cluster"`
}

// CommandLineOptions are the options Envoy was started with.
type CommandLineOptions struct {
	DrainStrategy string `json:"drain_strategy"` // "Immediate", or "" for Gradual, the default
}

// GetNode is the node; it and GetId keep the names of the protobuf getters callers use.
func (s *ServerInfo) GetNode() *ServerNode { return &s.Node }

// GetId is the node id.
func (n *ServerNode) GetId() string { return n.ID }

// ServerInfo is GET /server_info.
func (a *Admin) ServerInfo(ctx context.Context) (*ServerInfo, error) {
	body, err := a.do(ctx, http.MethodGet, "/server_info", http.StatusOK)
	if err != nil {
		return nil, err
	}
	info := &ServerInfo{}
	if err := json.Unmarshal(body, info); err != nil {
		return nil, fmt.Errorf("decode /server_info: %w", err)
	}
	return info, nil
}

// Prometheus is GET /stats/prometheus: Envoy's metrics in the Prometheus text format.
func (a *Admin) Prometheus(ctx context.Context) ([]byte, error) {
	return a.do(ctx, http.MethodGet, "/stats/prometheus", http.StatusOK)
}

// do sends one request and returns the body; want 0 accepts any status.
func (a *Admin) do(ctx context.Context, method, path string, want int) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("envoy admin %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("envoy admin %s %s: %w", method, path, err)
	}
	if want != 0 && resp.StatusCode != want {
		return nil, fmt.Errorf("envoy admin %s %s: status %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(body))
	}
	return body, nil
}

// Readiness filters, as Istio's probe uses them.
const (
	configStatsFilter = `^(cluster_manager\.cds|listener_manager\.lds)\.(update_success|update_rejected)$`
	liveStatsFilter   = `^(server\.state|listener_manager\.workers_started)`
)

// CheckConfigReceived is the first step of Istio's Envoy readiness: CDS and LDS updates have
// been accepted at least once.
func (a *Admin) CheckConfigReceived(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	stats, err := a.Stats(ctx, configStatsFilter)
	if err != nil {
		return err
	}
	v := statValues(stats)
	cdsOK, cdsBad := v["cluster_manager.cds.update_success"], v["cluster_manager.cds.update_rejected"]
	ldsOK, ldsBad := v["listener_manager.lds.update_success"], v["listener_manager.lds.update_rejected"]
	counts := fmt.Sprintf("cds updates: %d successful, %d rejected; lds updates: %d successful, %d rejected", cdsOK, cdsBad, ldsOK, ldsBad)
	switch {
	case cdsOK > 0 && ldsOK > 0:
		return nil
	case cdsOK+cdsBad+ldsOK+ldsBad == 0:
		return fmt.Errorf("config not received from XDS server (is Istiod running?): %s", counts)
	case cdsBad > 0 || ldsBad > 0:
		return fmt.Errorf("config received from XDS server, but was rejected: %s", counts)
	}
	return fmt.Errorf("config not fully received from XDS server: %s", counts)
}

// CheckLive is the second step: server.state is LIVE (0) and the workers have started.
func (a *Admin) CheckLive(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	stats, err := a.Stats(ctx, liveStatsFilter)
	if err != nil {
		return err
	}
	v := statValues(stats)
	state, ok := v["server.state"]
	if !ok {
		return fmt.Errorf("envoy server.state is not reported yet")
	}
	if state != 0 {
		return fmt.Errorf("server is not live, current state is: %s", serverState(state))
	}
	if v["listener_manager.workers_started"] != 1 {
		return fmt.Errorf("workers have not yet started")
	}
	return nil
}

func serverState(s uint64) string {
	switch s {
	case 0:
		return "LIVE"
	case 1:
		return "DRAINING"
	case 2:
		return "PRE_INITIALIZING"
	case 3:
		return "INITIALIZING"
	}
	return strconv.FormatUint(s, 10)
}

func statValues(stats []Stat) map[string]uint64 {
	m := map[string]uint64{}
	for _, s := range stats {
		if v, ok := s.Uint(); ok {
			m[s.Name] = v
		}
	}
	return m
}

// ActiveConnections sums downstream_cx_active over Envoy's listeners as Istio does: only
// listener.* stats, no per-worker stats, no internal listeners and none of the excluded
// (Istio's own) listeners. ok is false when Envoy reports no such stat at all.
func (a *Admin) ActiveConnections(ctx context.Context, excluded map[string]bool) (n uint64, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	stats, err := a.Stats(ctx, "downstream_cx_active$")
	if err != nil {
		return 0, false, err
	}
	if len(stats) == 0 {
		return 0, false, nil
	}
	for _, s := range stats {
		if !strings.HasPrefix(s.Name, "listener.") || strings.Contains(s.Name, "worker_") ||
			strings.HasPrefix(s.Name, "listener.envoy_internal_") || excluded[s.Name] {
			continue
		}
		if v, ok := s.Uint(); ok {
			n += v
		}
	}
	return n, true, nil
}

// IstioListenerStats are the downstream_cx_active stats of Istio's own listeners, which never
// count as traffic: the status and Prometheus ports on every wildcard address, the secure
// metrics ports, and the admin listener.
func IstioListenerStats(ports ...int) map[string]bool {
	m := map[string]bool{
		"listener.admin.downstream_cx_active":             true,
		"listener.admin.main_thread.downstream_cx_active": true,
	}
	for _, p := range ports {
		if p <= 0 {
			continue
		}
		for _, addr := range []string{"0.0.0.0", "[__]", "::", "127.0.0.1", "[__1]", "::1"} {
			m[fmt.Sprintf("listener.%s_%d.downstream_cx_active", addr, p)] = true
		}
	}
	return m
}
