package status

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/agentd/agentd/internal/kubeprobe"
	"github.com/agentd/agentd/internal/prober"
)

// BenchmarkAppProbe is one kubelet probe through the status port, the probe socket and the
// prober to an app on loopback, as agentd serves it; compare BenchmarkAppDirect.
func BenchmarkAppProbe(b *testing.B) {
	app := benchApp(b)
	sock := filepath.Join(b.TempDir(), "probe.sock")
	pl, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	probes, err := kubeprobe.ParseKubeProbes(fmt.Sprintf(`{"/app-health/app/readyz":{"httpGet":{"path":"/ok","port":%d},"timeoutSeconds":1}}`, app))
	if err != nil {
		b.Fatal(err)
	}
	ps := prober.NewServer(pl, prober.NewAppProbes(prober.AppProbeOptions{Probes: probes, PodIP: "127.0.0.1"}), nil)
	pctx, pcancel := context.WithCancel(context.Background())
	pdone := make(chan error, 1)
	go func() { pdone <- ps.Run(pctx) }()
	defer func() { pcancel(); <-pdone }()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{Listener: l, AppProbes: NewProbeForwarder(sock, nil)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	benchGet(b, "http://"+l.Addr().String()+"/app-health/app/readyz")
}

// BenchmarkAppDirect is the app's answer without agentd, on a new connection each time as
// the prober connects.
func BenchmarkAppDirect(b *testing.B) {
	benchGet(b, "http://127.0.0.1:"+strconv.Itoa(benchApp(b))+"/ok", "close")
}

func benchApp(b *testing.B) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	go srv.Serve(l)
	b.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

func benchGet(b *testing.B, url string, connection ...string) {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableKeepAlives: len(connection) > 0}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := c.Get(url)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}
