// Package httpgz is when the status port gzips an answer, as Istio's does (its status server
// is wrapped in klauspost/compress's gzhttp with the defaults): the client accepts gzip, the
// request is not HEAD, the body is at least MinSize bytes, and its type is not one that is
// compressed already.
package httpgz

import (
	"compress/gzip"
	"net/http"
	"strconv"
	"strings"
)

// MinSize is the smallest body that is gzipped (gzhttp's DefaultMinSize).
const MinSize = 1024

// Accepts reports whether r accepts a gzipped answer: a HEAD never does, otherwise the first
// "gzip" coding of Accept-Encoding with a q-value above 0.
func Accepts(r *http.Request) bool {
	if r.Method == http.MethodHead {
		return false
	}
	for part := range strings.SplitSeq(r.Header.Get("Accept-Encoding"), ",") {
		coding, params, _ := strings.Cut(part, ";")
		if strings.ToLower(strings.TrimSpace(coding)) != "gzip" {
			continue
		}
		q := 1.0
		for p := range strings.SplitSeq(params, ";") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "q="); ok {
				q, _ = strconv.ParseFloat(v, 64) // unreadable: 0, as gzhttp
			}
		}
		return q > 0
	}
	return false
}

// Compressible reports whether a body of content type ct is worth gzipping: not audio,
// video, JPEG or an archive (gzhttp's DefaultContentTypeFilter).
func Compressible(ct string) bool {
	ct = strings.ToLower(strings.TrimSpace(ct))
	for _, s := range []string{"compress", "zip", "snappy", "lzma", "xz", "zstd", "brotli", "stuffit"} {
		if strings.Contains(ct, s) {
			return false
		}
	}
	for _, p := range []string{"video/", "audio/", "image/jp"} {
		if strings.HasPrefix(ct, p) {
			return false
		}
	}
	return true
}

// Write answers code with body, gzipped when r accepts it and body is worth it, with the
// headers gzhttp sets: Vary: Accept-Encoding always, and a Content-Type sniffed from the body
// when there is none.
func Write(w http.ResponseWriter, r *http.Request, code int, body []byte) {
	h := w.Header()
	h.Add("Vary", "Accept-Encoding")
	if len(body) < MinSize || !Accepts(r) {
		w.WriteHeader(code)
		_, _ = w.Write(body)
		return
	}
	ct := h.Get("Content-Type")
	if ct == "" {
		ct = http.DetectContentType(body)
		h.Set("Content-Type", ct)
	}
	if !Compressible(ct) {
		w.WriteHeader(code)
		_, _ = w.Write(body)
		return
	}
	h.Set("Content-Encoding", "gzip")
	h.Del("Content-Length")
	w.WriteHeader(code)
	gz := gzip.NewWriter(w)
	_, _ = gz.Write(body)
	_ = gz.Close()
}
