package dnsproxy

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// ResolvConf is what dns-proxy takes from a resolv.conf: the upstream nameservers and the
// search list.
type ResolvConf struct {
	Servers []string // host:port
	Search  []string
}

// ReadResolvConf parses a resolv.conf. Besides the standard "nameserver IP" lines it
// accepts "nameserver IP:PORT" and "nameserver [IPv6]:PORT", so that tests and benchmarks
// can point it at a resolver on another port.
func ReadResolvConf(path string) (ResolvConf, error) {
	f, err := os.Open(path)
	if err != nil {
		return ResolvConf{}, fmt.Errorf("read resolv.conf: %w", err)
	}
	defer f.Close()
	var rc ResolvConf
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") || strings.HasPrefix(fields[0], ";") {
			continue
		}
		switch fields[0] {
		case "nameserver":
			server, err := nameserver(fields[1])
			if err != nil {
				return ResolvConf{}, fmt.Errorf("parse %s: %w", path, err)
			}
			rc.Servers = append(rc.Servers, server)
		case "search":
			rc.Search = fields[1:]
		case "domain":
			rc.Search = fields[1:2]
		}
	}
	if err := sc.Err(); err != nil {
		return ResolvConf{}, fmt.Errorf("read %s: %w", path, err)
	}
	return rc, nil
}

func nameserver(s string) (string, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		return net.JoinHostPort(ip.String(), "53"), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return "", fmt.Errorf("nameserver %q is neither IP nor IP:PORT", s)
	}
	return ap.String(), nil
}
