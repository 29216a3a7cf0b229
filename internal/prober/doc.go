// Package prober is the prober helper: it answers the rewritten kubelet app probes that
// agentd's status server forwards to it, and runs Istio's WorkloadEntry health check.
//
// agentd opens a Unix socket named "probe" and hands it down. agentd's status server reads
// kubelet's request for an app probe path (/app-health/<c>/livez, ...) and hands the client
// connection itself, with the request, over that socket (package connpass); the prober
// answers kubelet on it directly and keeps serving it, handing it back to agentd if a later
// request on it is for another path. Because the socket is agentd's, probes that arrive while
// the prober restarts wait in the socket's queue instead of failing.
//
// helper.go adapts it to agentd's plugin contract (README.md has the files).
package prober
