package prober

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// plainDo runs a plain-HTTP probe request as client (kubelet's client: a new connection,
// Connection: close, transparent gzip, same-host redirects) would, but writes the request
// and reads the answer on the connection itself: no pooled transport, no reader and writer
// goroutines per connection, no TCP keep-alive options on a socket that lives one request.
// The answer's body is read (up to maxProbeBody) before it returns. A redirect to follow is
// followed through client, with client's rules counting this first hop.
func (a *AppProbes) plainDo(req *http.Request, client *http.Client) (*http.Response, error) {
	var deadline time.Time
	if client.Timeout > 0 {
		deadline = time.Now().Add(client.Timeout)
	}
	resp, err := a.plainRoundTrip(req, deadline)
	if err != nil {
		return nil, err
	}
	loc := resp.Header.Get("Location")
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
	default:
		return resp, nil
	}
	if loc == "" { // net/http's client returns such a redirect as the answer
		return resp, nil
	}
	next, err := req.URL.Parse(loc)
	if err != nil {
		return nil, fmt.Errorf("failed to parse Location header %q: %w", loc, err)
	}
	if next.Hostname() != req.URL.Hostname() {
		return resp, nil // kubelet: a redirect to another host is not followed
	}
	// The next hops as net/http's client makes them: same method (GET), the headers copied,
	// the Host kept for a relative Location, Referer set to this hop.
	r2, err := http.NewRequestWithContext(req.Context(), http.MethodGet, next.String(), nil)
	if err != nil {
		return nil, err
	}
	r2.Header = req.Header.Clone()
	if req.Host != "" && req.Host != req.URL.Host && !next.IsAbs() {
		r2.Host = req.Host
	}
	if r2.Header.Get("Referer") == "" && (req.URL.Scheme != "https" || next.Scheme == "https") {
		ref := *req.URL
		ref.User = nil
		r2.Header.Set("Referer", ref.String())
	}
	c := *client
	if !deadline.IsZero() {
		if c.Timeout = time.Until(deadline); c.Timeout <= 0 {
			return nil, context.DeadlineExceeded
		}
	}
	c.CheckRedirect = func(r *http.Request, via []*http.Request) error {
		if r.URL.Hostname() != req.URL.Hostname() {
			return http.ErrUseLastResponse
		}
		if len(via)+1 >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return c.Do(r2)
}

// aLongTimeAgo is a deadline that has passed: it stops a blocked read or write at once.
var aLongTimeAgo = time.Unix(1, 0)

// Buffers of plain probes, reused: the request as written and the reader of the answer
// (bufio's 4 KiB each), which were most of a probe's garbage.
var (
	requestBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}
	answerReads = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}
	bodyBufs    = sync.Pool{New: func() any { return new(bytes.Buffer) }}
)

var gzipOnly = []string{"gzip"}

// answerBody is the body of an answer that plainRoundTrip has read whole.
type answerBody struct {
	*bytes.Reader
	b []byte
}

func (answerBody) Close() error { return nil }

// readBody is up to maxProbeBody bytes of resp's body.
func readBody(resp *http.Response) []byte {
	if b, ok := resp.Body.(answerBody); ok {
		return b.b
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	return body
}

// deadlineOnly is a context for net.Dialer that has a deadline and is never canceled before
// it: the dial's connect is bounded by the deadline (a write deadline on the socket) without
// the goroutine that package net starts to watch a context that can be canceled.
type deadlineOnly struct {
	context.Context
	deadline time.Time
}

func (c deadlineOnly) Deadline() (time.Time, bool) { return c.deadline, true }

// plainRoundTrip sends req on a new connection and reads the answer (body included, up to
// maxProbeBody). A zero deadline is none besides req's context.
func (a *AppProbes) plainRoundTrip(req *http.Request, deadline time.Time) (*http.Response, error) {
	ctx := req.Context()
	dialCtx := ctx
	if !deadline.IsZero() {
		// The request's cancellation (kubelet hung up) is watched once connected, below.
		dialCtx = deadlineOnly{context.Background(), deadline}
	}
	conn, err := a.plainDialer.DialContext(dialCtx, "tcp", req.URL.Host)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if !deadline.IsZero() {
		_ = conn.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
	defer stop()

	// As a transport without keep-alives that may ask for gzip writes it: Connection: close,
	// and Accept-Encoding: gzip unless the request has its own or asks for a range. req is
	// left as it was, for a redirect's next hop.
	out := *req
	out.Close = true
	gzipped := false
	if req.Header.Get("Accept-Encoding") == "" && req.Header.Get("Range") == "" {
		prev, had := req.Header["Accept-Encoding"]
		req.Header["Accept-Encoding"] = gzipOnly
		defer func() {
			if had {
				req.Header["Accept-Encoding"] = prev
			} else {
				delete(req.Header, "Accept-Encoding")
			}
		}()
		gzipped = true
	}
	wb := requestBufs.Get().(*bytes.Buffer)
	defer requestBufs.Put(wb)
	wb.Reset()
	if err := out.Write(wb); err != nil { // a bytes.Buffer: no bufio.Writer of its own
		return nil, err
	}
	if _, err := conn.Write(wb.Bytes()); err != nil {
		return nil, errors.Join(err, ctx.Err())
	}
	br := answerReads.Get().(*bufio.Reader)
	br.Reset(conn)
	defer func() {
		br.Reset(nil)
		answerReads.Put(br)
	}()
	var resp *http.Response
	for {
		if resp, err = http.ReadResponse(br, &out); err != nil {
			return nil, errors.Join(err, ctx.Err())
		}
		// 1xx answers other than 101 come before the real one, as net/http's transport skips them.
		if resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	var body io.Reader = resp.Body
	if gzipped && resp.Header.Get("Content-Encoding") == "gzip" {
		// As the transport that asked for gzip: the caller sees the decoded body.
		resp.Header.Del("Content-Encoding")
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
		resp.Uncompressed = true
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return nil, err
		}
		body = zr
	}
	bb := bodyBufs.Get().(*bytes.Buffer)
	defer bodyBufs.Put(bb)
	bb.Reset()
	_, _ = bb.ReadFrom(io.LimitReader(body, maxProbeBody)) // a body cut short still answers, as before
	b := bytes.Clone(bb.Bytes())
	resp.Body = answerBody{bytes.NewReader(b), b}
	return resp, nil
}

// plainProbeDialer is probeDialer without TCP keep-alive probes: the connection lives one
// request.
func plainProbeDialer(source *net.TCPAddr) *net.Dialer {
	d := probeDialer(source, 0)
	d.KeepAlive = -1
	return d
}
