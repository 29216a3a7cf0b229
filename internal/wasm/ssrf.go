package wasm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// cloudMetadata are metadata addresses outside the link-local range (Alibaba Cloud's, AWS's
// IPv6 one): always refused, as Istio refuses them.
var cloudMetadata = []netip.Prefix{
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("fd00:ec2::/32"),
}

// errBlocked is the error of a refused address: not worth a retry.
var errBlocked = errors.New("connection blocked")

// blocked says why a fetch may not connect to ip: link-local (which holds the cloud metadata
// services), a known metadata address, or one of the operator's blocked ranges. Private and
// loopback addresses are allowed: in-cluster registries live there.
func blocked(ip netip.Addr, extra []netip.Prefix) error {
	ip = ip.Unmap()
	if ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() {
		return fmt.Errorf("%w: %s is link-local", errBlocked, ip)
	}
	for _, p := range cloudMetadata {
		if p.Contains(ip) {
			return fmt.Errorf("%w: %s is a cloud metadata address", errBlocked, ip)
		}
	}
	for _, p := range extra {
		if p.Contains(ip) {
			return fmt.Errorf("%w: %s is in %s (BLOCKED_CIDRS_IN_WASM_FETCH)", errBlocked, ip, p)
		}
	}
	return nil
}

// dialer checks the address actually dialled, after name resolution, so that neither a
// hostname nor a redirect nor a token realm can reach a blocked address.
func dialer(extra []netip.Prefix) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{
		Timeout:   30 * time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("checking dialled address %q: %w", address, err)
			}
			return blocked(ap.Addr(), extra)
		},
	}
	return d.DialContext
}

// realmGuard refuses a registry's 401 whose bearer realm points at a private, loopback or
// link-local host: the token request would otherwise go wherever the registry says (Istio's
// guard against realm SSRF).
type realmGuard struct{ next http.RoundTripper }

func (g realmGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := g.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	for _, h := range resp.Header.Values("WWW-Authenticate") {
		if err := checkRealms(h); err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("refusing the registry's token realm: %w", err)
		}
	}
	return resp, nil
}

// checkRealms checks every realm="..." of a WWW-Authenticate header.
func checkRealms(h string) error {
	for {
		_, rest, ok := strings.Cut(h, `realm="`)
		if !ok {
			return nil
		}
		realm, after, ok := strings.Cut(rest, `"`)
		if !ok {
			return nil
		}
		if err := checkRealm(realm); err != nil {
			return err
		}
		h = after
	}
}

func checkRealm(realm string) error {
	u, err := url.Parse(realm)
	if err != nil {
		return fmt.Errorf("realm %q: %w", realm, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("realm %q: scheme %q not allowed", realm, u.Scheme)
	}
	host := u.Hostname()
	switch host {
	case "":
		return fmt.Errorf("realm %q has no host", realm)
	case "localhost", "metadata.google.internal":
		return fmt.Errorf("realm %q targets %s", realm, host)
	}
	if ip, err := netip.ParseAddr(host); err == nil && (ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast()) {
		return fmt.Errorf("realm %q targets a private, loopback or link-local address", realm)
	}
	return nil
}
