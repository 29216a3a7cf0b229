package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentd/agentd/internal/settings"
	"github.com/agentd/agentd/internal/supervisor"
)

func TestDNSSockets(t *testing.T) {
	dir := t.TempDir()
	conf := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v4 := conf("v4", "nameserver 10.96.0.10\n")
	v6 := conf("v6", "nameserver fd00::10\n")
	dual := conf("dual", "nameserver 10.96.0.10\nnameserver fd00::10\n")
	sockets := func(names ...string) []supervisor.Socket {
		var out []supervisor.Socket
		for i := 0; i < len(names); i += 3 {
			out = append(out, supervisor.Socket{Name: names[i], Network: names[i+1], Address: names[i+2]})
		}
		return out
	}
	tests := []struct {
		addr, resolvConf string
		want             []supervisor.Socket
	}{
		{"localhost:15053", v4, sockets("dns-udp", "udp", "127.0.0.1:15053", "dns-tcp", "tcp", "127.0.0.1:15053")},
		{"localhost:15053", v6, sockets("dns-udp6", "udp", "[::1]:15053", "dns-tcp6", "tcp", "[::1]:15053")},
		{"localhost:15053", dual, sockets("dns-udp", "udp", "127.0.0.1:15053", "dns-tcp", "tcp", "127.0.0.1:15053",
			"dns-udp6", "udp", "[::1]:15053", "dns-tcp6", "tcp", "[::1]:15053")},
		{"localhost:15053", filepath.Join(dir, "missing"), sockets("dns-udp", "udp", "127.0.0.1:15053", "dns-tcp", "tcp", "127.0.0.1:15053")},
		{"127.0.0.2:5353", dual, sockets("dns-udp", "udp", "127.0.0.2:5353", "dns-tcp", "tcp", "127.0.0.2:5353")},
		{"[::1]:5353", v4, sockets("dns-udp6", "udp", "[::1]:5353", "dns-tcp6", "tcp", "[::1]:5353")},
	}
	for _, tt := range tests {
		got, err := dnsSockets(tt.addr, tt.resolvConf)
		if err != nil {
			t.Errorf("dnsSockets(%q, %s) error %v", tt.addr, filepath.Base(tt.resolvConf), err)
			continue
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("dnsSockets(%q, %s) = %v, want %v", tt.addr, filepath.Base(tt.resolvConf), got, tt.want)
		}
	}
	// Port 0 becomes one free port, the same for both families.
	got, err := dnsSockets("localhost:0", dual)
	if err != nil || len(got) != 4 || got[0].Address == "127.0.0.1:0" || got[0].Address[len("127.0.0.1"):] != got[2].Address[len("[::1]"):] {
		t.Errorf("dnsSockets(localhost:0) = %v, %v; want one free port on both families", got, err)
	}
}

// TestDNSProxyOnlyWhenOn: dns-proxy is a child only when Istio's DNS proxy would run, and its
// settings never stop agentd (a bad one is warned about, as Istio does).
func TestDNSProxyOnlyWhenOn(t *testing.T) {
	tests := []struct {
		env  []string
		want bool
	}{
		{env: nil, want: false},
		{env: []string{"ISTIO_META_DNS_CAPTURE=false"}, want: false},
		{env: []string{"ISTIO_META_DNS_CAPTURE=true"}, want: true},
		{env: []string{"ISTIO_META_ENABLE_DNS_SERVER=true"}, want: true},
		{env: []string{"ISTIO_META_DNS_CAPTURE=true", "DNS_FORWARD_TIMEOUT=soon"}, want: true}, // Istio: warned, default
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.env, ","), func(t *testing.T) {
			resolv := filepath.Join(t.TempDir(), "resolv.conf")
			if err := os.WriteFile(resolv, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			s := resolve(t, settings.Flags{DNSAddress: "127.0.0.1:0", ResolvConf: resolv, DisableEnvoy: true}, tt.env...)
			c, err := buildConfigs(s, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.dns != nil; got != tt.want {
				t.Errorf("dns-proxy child: %v, want %v", got, tt.want)
			}
			if got, want := c.xds.GetNameTable(), tt.want; got != want {
				t.Errorf("xds-proxy asks for the name table: %v, want %v", got, want)
			}
		})
	}
}
