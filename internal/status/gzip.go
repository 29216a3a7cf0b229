package status

import (
	"compress/gzip"
	"net/http"
	"strings"
)

// gzipWriter returns a gzip writer over w when the client accepts gzip (Istio gzips its status
// port's answers), or nil. The caller closes it.
func gzipWriter(w http.ResponseWriter, r *http.Request) *gzip.Writer {
	if !acceptsGzip(r.Header.Get("Accept-Encoding")) {
		return nil
	}
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Add("Vary", "Accept-Encoding")
	return gzip.NewWriter(w)
}

func acceptsGzip(v string) bool {
	for part := range strings.SplitSeq(v, ",") {
		enc, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.TrimSpace(enc) == "gzip" && strings.ReplaceAll(q, " ", "") != "q=0" {
			return true
		}
	}
	return false
}
