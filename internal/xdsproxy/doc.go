// Package xdsproxy is the xDS proxy between Envoy (or proxyless gRPC clients) and the control
// plane: one upstream stream per downstream stream, with Istio's agent-only types (NDS, PCDS,
// health reports) handled in the proxy and exchanged with the rest of agentd over the bus.
//
// It is the xds-proxy helper: helper.go adapts it to agentd's plugin contract (README.md has
// the files).
package xdsproxy
