package deploy

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestSocketActivation hands agentd a listening socket as the socket units do
// (systemd-socket-activate with FileDescriptorName dns-tcp, as agentd-dns-tcp.socket) and
// checks that dns-proxy answers on it, in place of the TCP socket agentd would have opened.
func TestSocketActivation(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	activate, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Skip("systemd-socket-activate not installed")
	}
	bin := binaries(t)
	root := t.TempDir()
	pilot := fmt.Sprintf("127.%d.%d.%d:15010", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1)
	rootCert := filepath.Join(root, "var/run/secrets/istio/root-cert.pem")
	stopOnCleanup(t, exec.Command(filepath.Join(bin, "devplane"), "--xds-address", pilot, "--debug-address", "",
		"--services", "examples/services.yaml", "--ca-root-out", rootCert))
	waitUntil(t, "devplane's CA root", func() bool { fi, err := os.Stat(rootCert); return err == nil && fi.Size() > 0 })
	// Forwarded queries go nowhere: every answer is dns-proxy's own.
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	mustWrite(t, resolv, "nameserver 127.0.0.1\n")

	systemdAddr, ownAddr := freeAddr(t, false), freeAddr(t, true)
	// dns-proxy runs only with DNS on, as Istio's DNS proxy.
	agentd := exec.Command(activate, "-l", systemdAddr, "--fdname=dns-tcp", "--setenv=ISTIO_META_DNS_CAPTURE=true", "--",
		filepath.Join(bin, "agentd"), "run", "--root", root, "--helpers-dir", bin, "--disable-envoy",
		"--discovery-address", pilot, "--dns-address", ownAddr, "--resolv-conf", resolv,
		"--status-port", port(freeAddr(t, false)))
	stopOnCleanup(t, agentd)
	waitUntil(t, "dns-proxy to answer on systemd's socket", func() bool { return dnsOverTCP(systemdAddr) == nil })
	if err := dnsOverTCP(systemdAddr); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", ownAddr, time.Second); err == nil {
		c.Close()
		t.Errorf("agentd also listens on %s for TCP: the socket from systemd should replace it", ownAddr)
	}
}

// dnsOverTCP sends one query over TCP to addr and checks that an answer to it comes back.
func dnsOverTCP(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	// ID 0x4a44, recursion desired, one question: reviews.default.svc.cluster.local A IN.
	q := []byte{0x4a, 0x44, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, label := range []string{"reviews", "default", "svc", "cluster", "local"} {
		q = append(append(q, byte(len(label))), label...)
	}
	q = append(q, 0, 0, 1, 0, 1)
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
		return err
	}
	var n uint16
	if err := binary.Read(c, binary.BigEndian, &n); err != nil {
		return fmt.Errorf("read answer length: %w", err)
	}
	resp := make([]byte, n)
	if _, err := io.ReadFull(c, resp); err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if len(resp) < 12 || resp[0] != 0x4a || resp[1] != 0x44 || resp[2]&0x80 == 0 {
		return fmt.Errorf("not an answer to the query: % x", resp)
	}
	return nil
}
