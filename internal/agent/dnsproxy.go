package agent

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/miekg/dns"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/agentd/agentd/internal/settings"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

const (
	// defaultDNSAddress is DNS_PROXY_ADDR's default, where a non-root agentd falls back to.
	defaultDNSAddress = "localhost:15053"
	// rootResolvConf is the resolv.conf Istio prefers when it serves DNS on :53 as root.
	rootResolvConf = "/var/lib/istio/resolv.conf"
)

// dnsProxyConfig is dns-proxy's configuration and sockets, as Istio's agent sets up its DNS
// proxy: UDP and TCP on DNS_PROXY_ADDR (--dns-address), upstreams from --resolv-conf,
// DNS_FORWARD_TIMEOUT, DNS_FORWARD_PARALLEL, POD_NAMESPACE and --domain; readiness waits for
// the first name table, as Istio's does. Istio answers on :53 only as root, then before the
// first table too, and prefers its own copy of the resolv.conf; uid is agentd's.
func dnsProxyConfig(s *settings.Settings, uid int) (*agentv1.DNSProxyConfig, []socketSpec, []string, error) {
	var warnings []string
	cfg := &agentv1.DNSProxyConfig{
		ResolvConf:      s.ResolvConf,
		PodNamespace:    s.Env.PodNamespace,
		ProxyDomain:     s.Domain,
		ForwardTimeout:  durationpb.New(s.Env.DNSForwardTimeout.D()),
		ForwardParallel: s.Env.DNSForwardParallel,
	}
	addr := s.DNSAddress
	if strings.HasSuffix(addr, ":53") {
		if uid != 0 {
			warnings = append(warnings, fmt.Sprintf("DNS address %s and not running as root: using %s", addr, defaultDNSAddress))
			addr = defaultDNSAddress
		} else {
			cfg.RespondBeforeSync = true
			if s.Flags.ResolvConf == "" && fileExists(rootResolvConf) {
				cfg.ResolvConf = rootResolvConf
			}
		}
	}
	sockets, err := dnsSockets(addr, cfg.ResolvConf)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dns address %q: %w", addr, err)
	}
	return cfg, sockets, warnings, nil
}

// dnsSockets returns the UDP and TCP sockets for addr. For host "localhost" they are on
// 127.0.0.1 and/or [::1], by the families of the resolv.conf's nameservers, as Istio binds.
func dnsSockets(addr, resolvConf string) ([]socketSpec, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	hosts := []string{host}
	if host == "localhost" {
		hosts = nil
		v4, v6 := nameserverFamilies(resolvConf)
		if v4 {
			hosts = append(hosts, "127.0.0.1")
		}
		if v6 {
			hosts = append(hosts, "::1")
		}
	}
	var sockets []socketSpec
	for _, h := range hosts {
		a, err := sharedPort(net.JoinHostPort(h, port))
		if err != nil {
			return nil, err
		}
		_, port, _ = net.SplitHostPort(a) // port 0 becomes one port for both families
		udp, tcp := agentv1.SocketDNSUDP, agentv1.SocketDNSTCP
		if ip, err := netip.ParseAddr(h); err == nil && ip.Is6() && !ip.Is4In6() {
			udp, tcp = agentv1.SocketDNSUDP6, agentv1.SocketDNSTCP6
		}
		sockets = append(sockets,
			socketSpec{Name: udp, Network: "udp", Address: a},
			socketSpec{Name: tcp, Network: "tcp", Address: a})
	}
	return sockets, nil
}

// nameserverFamilies reports whether the resolv.conf has IPv4 and IPv6 nameservers; with
// none (or no readable file) it is IPv4 only.
func nameserverFamilies(resolvConf string) (v4, v6 bool) {
	rc, err := dns.ClientConfigFromFile(resolvConf)
	if err != nil {
		return true, false
	}
	for _, s := range rc.Servers {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if ip.Is4() || ip.Is4In6() {
			v4 = true
		} else {
			v6 = true
		}
	}
	return v4 || !v6, v6
}

// sharedPort turns port 0 into one port free for both TCP and UDP, so that tests can run
// agentd on any free port and still get one DNS address.
func sharedPort(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port != "0" {
		return addr, err
	}
	for range 20 {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return "", err
		}
		got := l.Addr().String()
		pc, err := net.ListenPacket("udp", got)
		l.Close()
		if err == nil {
			pc.Close()
			return got, nil
		}
	}
	return "", fmt.Errorf("no port free for both TCP and UDP on %s", host)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
