// Package bootstrap turns agentd's resolved settings into what Envoy is started with, as
// Istio's pilot-agent makes it: the node (id, cluster, locality, generateNodeMetadata's
// metadata), the bootstrap JSON (the mesh's own template rendered with Istio's option set
// when one exists, else agentd's own, which equals what Istio's template renders), and
// Envoy's command line. Nothing here starts a process; configcheck validates every output
// strictly with go-control-plane's types in the tests.
package bootstrap
