package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// requestCommand is pilot-agent's `request`: an HTTP request to one of the proxy's local
// ports, printing only the response body (istioctl parses it).
func requestCommand() *cli.Command {
	return &cli.Command{
		Name:      "request",
		Usage:     "send an HTTP request to Envoy's admin port or agentd's status port, as pilot-agent request",
		ArgsUsage: "[METHOD] PATH [BODY]",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "debug-port", Value: 15000, Usage: "port: 15000 (Envoy admin), 15020 (status), 15021 (readiness), 15004 (debug)"},
		},
		Action: func(c *cli.Context) error {
			method, path, body := http.MethodGet, "", ""
			switch args := c.Args().Slice(); len(args) {
			case 1:
				path = args[0]
			case 2:
				method, path = strings.ToUpper(args[0]), args[1]
			case 3:
				method, path, body = strings.ToUpper(args[0]), args[1], args[2]
			default:
				return fmt.Errorf("usage: agentd request [METHOD] PATH [BODY]")
			}
			out, err := request(c.Int("debug-port"), method, path, body)
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(out)
			return err
		},
	}
}

// request is pilot-agent's request: only Istio's local ports; a status above 399 other than
// 404 is an error.
func request(port int, method, path, body string) ([]byte, error) {
	switch port {
	case 15000, 15020, 15021, 15004:
	default:
		return nil, fmt.Errorf("port %d is not allowed: 15000, 15020, 15021 or 15004", port)
	}
	return doRequest("http://localhost:"+strconv.Itoa(port), method, path, body)
}

func doRequest(base, method, path, body string) ([]byte, error) {
	url := base + "/" + strings.TrimPrefix(path, "/")
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	if resp.StatusCode > 399 && resp.StatusCode != http.StatusNotFound {
		return nil, fmt.Errorf("%s %s: status %d: %s", method, url, resp.StatusCode, strings.TrimSpace(string(out)))
	}
	return out, nil
}
