// Package envoy gives agentd its Envoy as Istio's pilot-agent runs it: ProxyConfig and node
// identity, a validated bootstrap, the command line, the admin API client, and the process
// itself with Istio's drain and stop.
package envoy
