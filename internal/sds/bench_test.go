package sds

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// BenchmarkSDSPush measures pushes of a changed secret to 100 SotW clients on the Unix
// socket: one op is one new version delivered to, and ACKed by, every client.
func BenchmarkSDSPush(b *testing.B) {
	const clients = 100
	c := mustCA(b)
	dir := b.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	pairs := []keyPair{newPair(b, c, "spiffe://td/a"), newPair(b, c, "spiffe://td/b")}
	write(b, cert, pairs[0].cert)
	write(b, key, pairs[0].key)
	name := FileCertResource(cert, key)
	secrets := []*tlsv3.Secret{certSecret(name, pairs[0].cert, pairs[0].key), certSecret(name, pairs[1].cert, pairs[1].key)}
	s := startSDS(b, Options{FilesOnly: true})
	conn := dial(b, s.sock)

	ctx, cancel := context.WithCancel(context.Background())
	var received, ready, stopped sync.WaitGroup
	ready.Add(clients)
	for range clients {
		st, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
		if err != nil {
			b.Fatal(err)
		}
		req := &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "bench"}, TypeUrl: resourcev3.SecretType, ResourceNames: []string{name}}
		if err := st.Send(req); err != nil {
			b.Fatal(err)
		}
		stopped.Add(1)
		go func() {
			defer stopped.Done()
			for first := true; ; first = false {
				resp, err := st.Recv()
				if err != nil {
					return
				}
				req.VersionInfo, req.ResponseNonce = resp.GetVersionInfo(), resp.GetNonce()
				if st.Send(req) != nil {
					return
				}
				if first {
					ready.Done()
				} else {
					received.Done()
				}
			}
		}()
	}
	ready.Wait()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		received.Add(clients)
		s.publish(name, secrets[(i+1)%2])
		received.Wait()
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N*clients)/elapsed.Seconds(), "pushes/s")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "rounds/s")
	cancel()
	stopped.Wait()
}
