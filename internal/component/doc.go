// Package component is the go-plugin glue between agentd and its helpers: the handshake and
// protocol version, the helper side (Serve) and the agentd side (Start), and the bus client.
package component
