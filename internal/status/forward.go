package status

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"

	"github.com/hashicorp/go-hclog"
)

// NewProbeForwarder forwards the app probe paths to the prober helper, which serves HTTP on
// the Unix socket at path (agentd's socket "probe"). The request goes as kubelet sent it: same
// path, Host and headers, no X-Forwarded-* added; the prober's status and body come back. A
// prober that cannot be reached gives 500, as a probe that cannot be run does.
func NewProbeForwarder(path string, log hclog.Logger) http.Handler {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	var d net.Dialer
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		},
		DisableCompression:  true, // kubelet's Accept-Encoding goes through as it was
		MaxIdleConnsPerHost: 16,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "prober"
			pr.Out.Host = pr.In.Host
			// Rewrite drops these before it runs; kubelet's own go through.
			for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
				if v, ok := pr.In.Header[h]; ok {
					pr.Out.Header[h] = v
				}
			}
		},
		Transport: transport,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Error("forward app probe to the prober", "path", r.URL.Path, "error", err)
			w.WriteHeader(http.StatusInternalServerError)
		},
	}
}
