package status

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// WaitOptions are pilot-agent wait's flags; the zero value is Istio's defaults.
type WaitOptions struct {
	URL            string        // --url (http://localhost:15021/healthz/ready)
	Timeout        time.Duration // --timeoutSeconds (60 s)
	RequestTimeout time.Duration // --requestTimeoutMillis (500 ms)
	Period         time.Duration // --periodMillis (500 ms)
}

// DefaultWaitURL is where pilot-agent wait polls: Envoy's readiness listener.
const DefaultWaitURL = "http://localhost:15021/healthz/ready"

// Wait polls URL every Period until it answers 200 and returns nil, or returns Istio's error
// with the last failure once Timeout has passed. The first attempt is after one Period, as
// Istio's.
func Wait(ctx context.Context, o WaitOptions) error {
	if o.URL == "" {
		o.URL = DefaultWaitURL
	}
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 500 * time.Millisecond
	}
	if o.Period <= 0 {
		o.Period = 500 * time.Millisecond
	}
	client := &http.Client{Timeout: o.RequestTimeout}
	deadline := time.NewTimer(o.Timeout)
	defer deadline.Stop()
	ticker := time.NewTicker(o.Period)
	defer ticker.Stop()
	var err error
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("timeout waiting for Envoy proxy to become ready. Last error: %v", err)
		case <-ticker.C:
			if err = checkReady(ctx, client, o.URL); err == nil {
				return nil
			}
		}
	}
}

func checkReady(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP status code %v", resp.StatusCode)
	}
	return nil
}
