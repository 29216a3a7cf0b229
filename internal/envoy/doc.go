// Package envoy runs agentd's Envoy as Istio's pilot-agent runs it: the process with its
// logs, the admin API client, readiness, and Istio's drain and stop. What Envoy is started
// with (the bootstrap, the command line, the node) is package envoy/bootstrap: pure functions
// of the resolved settings, testable without a process.
package envoy
