package status

import (
	"compress/gzip"
	"net/http"

	"github.com/agentd/agentd/internal/httpgz"
)

// gzipWriter returns a gzip writer over w when the client accepts gzip (Istio gzips its status
// port's answers), or nil. The caller closes it.
func gzipWriter(w http.ResponseWriter, r *http.Request) *gzip.Writer {
	if !httpgz.Accepts(r) {
		return nil
	}
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Add("Vary", "Accept-Encoding")
	return gzip.NewWriter(w)
}
