// Package sds is agentd's sds-server: Istio's secret discovery service for Envoy, with the
// workload certificate from the CA (rotated before it expires), certificates from watched
// files, and the trust roots.
package sds
