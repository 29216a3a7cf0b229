package dnsproxy

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadResolvConf: a resolv.conf, garbage included, never panics, and every nameserver
// it accepts is an address and port dns-proxy can dial.
func FuzzReadResolvConf(f *testing.F) {
	f.Add("nameserver 10.96.0.10\nsearch ns1.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n")
	f.Add("nameserver 127.0.0.1:5353\nnameserver [::1]:53\nnameserver fd00::10\n# comment\n; comment\n")
	f.Add("nameserver\nnameserver not-an-ip\nsearch\n")
	f.Add("nameserver fe80::1%eth0\n")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, text string) {
		path := filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		rc, err := ReadResolvConf(path)
		if err != nil {
			return
		}
		for _, s := range rc.Servers {
			if _, err := netip.ParseAddrPort(s); err != nil {
				t.Fatalf("accepted nameserver %q: %v", s, err)
			}
		}
	})
}
