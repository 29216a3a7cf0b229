package prober

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// answerWriter is the http.ResponseWriter of a probe that serveConn answers: it keeps the
// whole answer (a probe's is 10 KiB at most) and writes it in one piece, with the header
// net/http's server writes for a handler that has returned (wire).
type answerWriter struct {
	header http.Header
	code   int // 0 until WriteHeader
	body   bytes.Buffer
	out    bytes.Buffer
	date   []byte
}

// answers are reused: kubelet's probes come one after the other.
var answers = sync.Pool{New: func() any { return &answerWriter{header: http.Header{}} }}

func (w *answerWriter) reset() {
	clear(w.header)
	w.code = 0
	w.body.Reset()
	w.out.Reset()
}

func (w *answerWriter) Header() http.Header { return w.header }

func (w *answerWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *answerWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if !bodyAllowed(w.code) {
		return 0, http.ErrBodyNotAllowed
	}
	return w.body.Write(p)
}

// bodyAllowed: 1xx, 204 and 304 answers have no body (net/http's rule).
func bodyAllowed(code int) bool {
	return (code < 100 || code > 199) && code != http.StatusNoContent && code != http.StatusNotModified
}

// wire is the answer to r (HTTP/1.1) as net/http's server writes it once the handler has
// returned: the status line, the handler's header fields, then Date, Content-Length (the
// body's, when the handler set none and the body may have one), Content-Type (sniffed from
// the body when the handler set none and no Content-Encoding), Connection: close when the
// connection closes after it; the body unless r is a HEAD. One difference: an answer over
// net/http's 2 KiB buffer goes with a Content-Length here, where net/http chunks it.
func (w *answerWriter) wire(r *http.Request, closeAfter bool) []byte {
	code := w.code
	if code == 0 {
		code = http.StatusOK
	}
	h, out := w.header, &w.out
	out.WriteString("HTTP/1.1 ")
	if text := http.StatusText(code); text != "" {
		out.WriteString(strconv.Itoa(code) + " " + text + "\r\n")
	} else {
		fmt.Fprintf(out, "%03d status code %d\r\n", code, code)
	}
	var contentLength, contentType string
	isHEAD := r.Method == http.MethodHead
	if bodyAllowed(code) {
		if _, ok := h["Content-Length"]; !ok && (!isHEAD || w.body.Len() > 0) {
			contentLength = strconv.Itoa(w.body.Len())
		}
		if _, ok := h["Content-Type"]; !ok && h.Get("Content-Encoding") == "" && w.body.Len() > 0 {
			contentType = http.DetectContentType(w.body.Bytes())
		}
	} else {
		h.Del("Content-Length")
		h.Del("Transfer-Encoding")
		if code == http.StatusNotModified {
			h.Del("Content-Type")
		}
	}
	if closeAfter {
		h.Del("Connection")
	}
	_ = h.Write(out)
	if _, ok := h["Date"]; !ok {
		w.date = time.Now().UTC().AppendFormat(w.date[:0], http.TimeFormat)
		out.WriteString("Date: ")
		out.Write(w.date)
		out.WriteString("\r\n")
	}
	if contentLength != "" {
		out.WriteString("Content-Length: " + contentLength + "\r\n")
	}
	if contentType != "" {
		out.WriteString("Content-Type: " + contentType + "\r\n")
	}
	if closeAfter {
		out.WriteString("Connection: close\r\n")
	}
	out.WriteString("\r\n")
	if !isHEAD && bodyAllowed(code) {
		out.Write(w.body.Bytes())
	}
	return out.Bytes()
}
