package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentd/agentd/internal/caclient"
)

// TestPlaintextCAWithoutRootFile: as with Istio's pilot-agent, a CA on the plaintext port
// 15010 needs no var/run/secrets/istio/root-cert.pem: agentd gets its workload certificate
// and is ready.
func TestPlaintextCAWithoutRootFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "services.yaml")
	if err := os.WriteFile(file, []byte("services: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// xDS and the CA in plaintext on port 15010 of a random loopback address.
	addr := fmt.Sprintf("127.%d.%d.%d:15010", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1)
	startDevplane(t, addr, file)
	// CA_ROOT_CA empty: Istio's default, the istiod root of the (here absent) ConfigMap mount.
	a := startAgentd(t, []string{"CA_ADDR=" + addr, "CA_ROOT_CA=", "POD_NAMESPACE=ns1", "SERVICE_ACCOUNT=sa1", "ECC_SIGNATURE_ALGORITHM=ECDSA"},
		"--disable-envoy", "--discovery-address", addr)
	a.WaitReady()
	w, _ := fetchWorkload(t, a)
	if got, want := w.leaf.URIs[0].String(), caclient.SPIFFEID("cluster.local", "ns1", "sa1"); got != want {
		t.Errorf("workload identity = %s, want %s", got, want)
	}
	if _, err := os.Stat(filepath.Join(a.Root, "var/run/secrets/istio/root-cert.pem")); !os.IsNotExist(err) {
		t.Errorf("root-cert.pem exists (%v): the test must run without it", err)
	}
}
