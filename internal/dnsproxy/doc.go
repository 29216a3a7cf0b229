// Package dnsproxy is the DNS server of dns-proxy: it answers mesh names from Istio's name
// table and forwards the rest to the resolv.conf nameservers.
//
// helper.go adapts it to agentd's plugin contract (README.md has the files).
package dnsproxy
