package agent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestGRPCReady(t *testing.T) {
	dir := t.TempDir()
	boot, certs := filepath.Join(dir, "grpc-bootstrap.json"), filepath.Join(dir, "certs")
	write := func(p string) {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	check := func(name string, a *Agent, wantReady bool) {
		t.Helper()
		if err := a.grpcReady(); (err == nil) != wantReady {
			t.Errorf("%s: grpcReady() = %v, want ready %v", name, err, wantReady)
		}
	}
	check("no bootstrap configured", &Agent{}, true)
	check("bootstrap missing", &Agent{grpcBootstrap: boot}, false)
	write(boot)
	check("bootstrap written", &Agent{grpcBootstrap: boot}, true)
	check("certificates not yet written", &Agent{grpcBootstrap: boot, grpcCertDir: certs}, false)
	write(filepath.Join(certs, "cert-chain.pem"))
	write(filepath.Join(certs, "key.pem"))
	check("certificates written", &Agent{grpcBootstrap: boot, grpcCertDir: certs}, true)
}
