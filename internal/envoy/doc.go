// Package envoy gives agentd its Envoy as Istio's pilot-agent runs it: ProxyConfig and node
// identity, the bootstrap (JSON built from checked input), the command line, the admin API
// client, and the process itself with Istio's drain and stop.
package envoy
