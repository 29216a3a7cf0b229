package control

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
)

// Client talks to a running agentd's control socket.
type Client struct {
	path string
	http *http.Client
}

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
	body, err := c.do(ctx, http.MethodGet, "/v1/status", nil)
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
	_, err := c.do(ctx, http.MethodPost, "/v1/restart/"+name, nil)
	return err
}

// Swap replaces a child's binary.
func (c *Client) Swap(ctx context.Context, req SwapRequest) error {
	body, _ := json.Marshal(req)
	_, err := c.do(ctx, http.MethodPost, "/v1/swap", body)
	return err
}

// Publish publishes a payload (protojson of a google.protobuf.Any) on a bus topic.
func (c *Client) Publish(ctx context.Context, topic string, anyJSON []byte) error {
	_, err := c.do(ctx, http.MethodPost, "/v1/publish/"+topic, anyJSON)
	return err
}

func (c *Client) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
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
