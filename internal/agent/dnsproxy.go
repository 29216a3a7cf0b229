package agent

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/agentd/agentd/internal/dnsproxy"
	"github.com/agentd/agentd/internal/supervisor"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// Istio's DNS proxy defaults.
const (
	defaultDNSAddress = "localhost:15053"
	// rootResolvConf is the resolv.conf Istio prefers when it serves DNS on :53 as root.
	rootResolvConf = "/var/lib/istio/resolv.conf"
)

// dnsOn reports whether Istio's agent would run its DNS proxy: ISTIO_META_DNS_CAPTURE or
// ISTIO_META_ENABLE_DNS_SERVER. xds-proxy asks for the name table only then.
func (a *Agent) dnsOn() bool {
	return envTrue(a.opts.getenv("ISTIO_META_DNS_CAPTURE")) || envTrue(a.opts.getenv("ISTIO_META_ENABLE_DNS_SERVER"))
}

// dnsProxy is the dns-proxy child, set up as Istio's agent sets up its DNS proxy: UDP and TCP
// sockets on DNS_PROXY_ADDR (--dns-address), upstreams from --resolv-conf, DNS_FORWARD_TIMEOUT,
// DNS_FORWARD_PARALLEL and POD_NAMESPACE; readiness waits for the first name table, as
// Istio's does. It is nil, no process at all, when the DNS proxy is off (dnsOn).
func (a *Agent) dnsProxy() (*supervisor.Child, error) {
	cfg := &agentv1.DNSProxyConfig{
		ResolvConf:   a.opts.ResolvConf,
		PodNamespace: a.opts.getenv("POD_NAMESPACE"),
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = dnsproxy.DefaultResolvConf
	}
	if v := a.opts.getenv("DNS_FORWARD_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("DNS_FORWARD_TIMEOUT %q: want a positive duration", v)
		}
		cfg.ForwardTimeout = durationpb.New(d)
	}
	if v := a.opts.getenv("DNS_FORWARD_PARALLEL"); v != "" {
		p, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("DNS_FORWARD_PARALLEL %q: %w", v, err)
		}
		cfg.ForwardParallel = p
	}
	if !a.dnsOn() { // its settings still have to parse: a typo shows before DNS is turned on
		return nil, nil
	}
	addr := a.opts.DNSAddress
	if addr == "" {
		addr = defaultDNSAddress
	}
	if strings.HasSuffix(addr, ":53") {
		// Istio answers on :53 only as root, then before the first table too, and prefers
		// its own copy of the resolv.conf.
		if os.Getuid() != 0 {
			a.log.Error("DNS address :53 and not running as root, using the default", "address", addr, "default", defaultDNSAddress)
			addr = defaultDNSAddress
		} else {
			cfg.RespondBeforeSync = true
			if _, err := os.Stat(rootResolvConf); err == nil && (a.opts.ResolvConf == "" || a.opts.ResolvConf == dnsproxy.DefaultResolvConf) {
				cfg.ResolvConf = rootResolvConf
			}
		}
	}
	sockets, err := dnsSockets(addr, cfg.ResolvConf)
	if err != nil {
		return nil, fmt.Errorf("dns address %q: %w", addr, err)
	}
	return a.helper("dns-proxy", cfg, sockets...), nil
}

// dnsSockets returns the UDP and TCP sockets for addr. For host "localhost" they are on
// 127.0.0.1 and/or [::1], by the families of the resolv.conf's nameservers, as Istio binds.
func dnsSockets(addr, resolvConf string) ([]supervisor.Socket, error) {
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
	var sockets []supervisor.Socket
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
			supervisor.Socket{Name: udp, Network: "udp", Address: a},
			supervisor.Socket{Name: tcp, Network: "tcp", Address: a})
	}
	return sockets, nil
}

// nameserverFamilies reports whether the resolv.conf has IPv4 and IPv6 nameservers; with
// none (or no readable file) it is IPv4 only.
func nameserverFamilies(resolvConf string) (v4, v6 bool) {
	rc, err := dnsproxy.ReadResolvConf(resolvConf)
	if err != nil {
		return true, false
	}
	for _, s := range rc.Servers {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			continue
		}
		if ap.Addr().Is4() || ap.Addr().Is4In6() {
			v4 = true
		} else {
			v6 = true
		}
	}
	return v4 || !v6, v6
}

func envTrue(v string) bool {
	b, _ := strconv.ParseBool(v)
	return b
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
