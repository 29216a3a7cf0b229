package caclient

import (
	"context"
	"testing"
	"time"
)

// BenchmarkCSR measures a certificate round trip as sds-server does one: make the key and
// CSR, have it signed by a CA over loopback TLS, and check the answer.
func BenchmarkCSR(b *testing.B) {
	for _, k := range []struct {
		name string
		opts KeyOptions
	}{
		{"RSA-2048", KeyOptions{}},
		{"ECDSA-P256", KeyOptions{ECCSignatureAlgorithm: "ECDSA"}},
	} {
		b.Run(k.name, func(b *testing.B) {
			_, addr, root := startCA(b, nil)
			c, err := New(Options{Address: addr, RootCertFile: root})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			for b.Loop() {
				csr, _, key, err := NewCSR(k.opts, "spiffe://cluster.local/ns/bench/sa/bench")
				if err != nil {
					b.Fatal(err)
				}
				chain, err := c.Sign(ctx, csr, time.Hour)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Verify(chain, key.Public(), time.Now()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
