package control

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Client talks to a running agentd's control socket. Each request ends by itself: an agentd
// that does not answer (hung, or out of file descriptors) makes a command fail, not hang.
type Client struct {
	path string
	http *http.Client
	// Timeout bounds each request (default DefaultTimeout); a swap gets its own ready timeout
	// on top, a restart RestartTimeout.
	Timeout time.Duration
}

// Request deadlines of the control client.
const (
	DefaultTimeout = 10 * time.Second
	// RestartTimeout covers a drain and a stop (each at most a few seconds) and a start.
	RestartTimeout = time.Minute
)

// NewClient returns a client of the control socket at path.
func NewClient(path string) *Client {
	return &Client{path: path, http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
		// One connection per request: a Client is made per command, and an idle
		// connection left behind would hold a file descriptor in agentd.
		DisableKeepAlives: true,
	}}}
}

// Status returns agentd's readiness and its children.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	body, err := c.do(ctx, 0, http.MethodGet, "/v1/status", nil)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("decode status: %w", err)
	}
	return st, nil
}

// Restart restarts a child.
func (c *Client) Restart(ctx context.Context, name string) error {
	_, err := c.do(ctx, RestartTimeout, http.MethodPost, "/v1/restart/"+name, nil)
	return err
}

// Swap replaces a child's binary.
func (c *Client) Swap(ctx context.Context, req SwapRequest) error {
	body, _ := json.Marshal(req)
	_, err := c.do(ctx, RestartTimeout+req.Timeout, http.MethodPost, "/v1/swap", body)
	return err
}

// Publish publishes a payload (protojson of a google.protobuf.Any) on a bus topic.
func (c *Client) Publish(ctx context.Context, topic string, anyJSON []byte) error {
	_, err := c.do(ctx, 0, http.MethodPost, "/v1/publish/"+topic, anyJSON)
	return err
}

// do sends one request, within timeout (zero: c.Timeout, or DefaultTimeout).
func (c *Client) do(ctx context.Context, timeout time.Duration, method, path string, body []byte) ([]byte, error) {
	if timeout == 0 {
		timeout = cmp.Or(c.Timeout, DefaultTimeout)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://agentd"+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agentd control socket %s: %w", c.path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		return nil, fmt.Errorf("%s", strings.TrimSpace(string(out)))
	}
	return out, nil
}
