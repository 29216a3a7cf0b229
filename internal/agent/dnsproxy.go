package agent

import (
	"fmt"
	"net"

	"github.com/agentd/agentd/internal/supervisor"
)

// dnsProxy is the dns-proxy child: one UDP and one TCP socket on the DNS address.
func (a *Agent) dnsProxy() (*supervisor.Child, error) {
	addr, err := sharedPort(a.opts.DNSAddress)
	if err != nil {
		return nil, fmt.Errorf("dns address %q: %w", a.opts.DNSAddress, err)
	}
	return a.helper("dns-proxy", nil,
		supervisor.Socket{Name: "dns-udp", Network: "udp", Address: addr},
		supervisor.Socket{Name: "dns-tcp", Network: "tcp", Address: addr},
	), nil
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
