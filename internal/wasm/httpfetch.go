package wasm

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// httpFetcher downloads modules over HTTP(S) with Istio's retries: 5xx answers (but 501, 505
// and 511) and transport errors are retried with exponential backoff from 500 ms.
type httpFetcher struct {
	secure, insecure *http.Client
	retries          int
	backoff          time.Duration
	max              int64
}

func newHTTPFetcher(o Options) *httpFetcher {
	client := func(skipVerify bool) *http.Client {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.DialContext = dialer(o.BlockedCIDRs)
		if skipVerify {
			t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // WASM_INSECURE_REGISTRIES
		}
		return &http.Client{Timeout: o.HTTPRequestTimeout, Transport: t}
	}
	return &httpFetcher{
		secure: client(false), insecure: client(true),
		retries: o.HTTPRequestMaxRetries, backoff: 500 * time.Millisecond, max: o.MaxBinarySize,
	}
}

// errPermanent marks an answer not worth retrying.
var errPermanent = errors.New("not retried")

// fetch returns the module at url, unwrapped from gzip and tar where it is wrapped.
func (f *httpFetcher) fetch(ctx context.Context, url string, insecure bool) ([]byte, error) {
	c := f.secure
	if insecure {
		c = f.insecure
	}
	wait := f.backoff
	var last error
	for attempt := 1; attempt <= f.retries; attempt++ {
		b, err := f.get(ctx, c, url)
		if err == nil {
			return unwrap(b, f.max)
		}
		last = err
		if errors.Is(err, errPermanent) || errors.Is(err, errBlocked) || ctx.Err() != nil || attempt == f.retries {
			break
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		wait *= 2
	}
	return nil, fmt.Errorf("downloading %s: %w", url, last)
}

func (f *httpFetcher) get(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errPermanent, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		err := fmt.Errorf("status %s", resp.Status)
		if !retryable(resp.StatusCode) {
			err = fmt.Errorf("%w: %w", errPermanent, err)
		}
		return nil, err
	}
	return readAtMost(resp.Body, f.max)
}

func retryable(code int) bool {
	switch code {
	case http.StatusNotImplemented, http.StatusHTTPVersionNotSupported, http.StatusNetworkAuthenticationRequired:
		return false
	}
	return code >= 500
}

// readAtMost reads r whole, refusing more than max bytes (Istio truncates instead, and then
// fails on the checksum or the Wasm header).
func readAtMost(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading: %w", errPermanent, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w: module larger than %d bytes (ISTIO_WASM_MAX_BINARY_SIZE_BYTES)", errPermanent, max)
	}
	return b, nil
}

var (
	wasmMagic = []byte("\x00asm")
	gzipMagic = []byte{0x1f, 0x8b}
	tarMagic  = []byte("ustar")
)

// validWasm reports whether b starts with a Wasm header (magic and version).
func validWasm(b []byte) bool { return len(b) >= 8 && bytes.HasPrefix(b, wasmMagic) }

// unwrap takes a module out of gzip and tar wrappers (the first file of a tar), as Istio
// accepts them; what is neither is returned as it is, for the Wasm check to judge.
func unwrap(b []byte, max int64) ([]byte, error) {
	for range 4 { // a .tar.gz is two layers; more is not a module
		var err error
		switch {
		case validWasm(b):
			return b, nil
		case bytes.HasPrefix(b, gzipMagic):
			var zr *gzip.Reader
			if zr, err = gzip.NewReader(bytes.NewReader(b)); err == nil {
				b, err = readAtMost(zr, max)
			}
		case len(b) > 262 && bytes.Equal(b[257:262], tarMagic):
			tr := tar.NewReader(bytes.NewReader(b))
			if _, err = tr.Next(); err == nil {
				b, err = readAtMost(tr, max)
			}
		default:
			return b, nil
		}
		if err != nil {
			return nil, fmt.Errorf("unpacking the module: %w", err)
		}
	}
	return b, nil
}
