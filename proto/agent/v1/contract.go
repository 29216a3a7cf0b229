package agentv1

// The names agentd and its helpers share, beside the messages they name: agentd hands each
// helper its sockets by these names (LISTEN_FDNAMES), and the bus carries these topics with
// these payloads. Nothing else crosses the plugin boundary.

// Inherited sockets, by name.
const (
	SocketXDS         = "xds"       // xds-proxy: Envoy's and proxyless clients' ADS (etc/istio/proxy/XDS)
	SocketSDSWorkload = "sds"       // sds-server: the workload SDS socket
	SocketSDSFiles    = "sds-files" // sds-server: the files-only SDS socket, beside a live SPIRE-like server
	SocketDNSUDP      = "dns-udp"   // dns-proxy, IPv4
	SocketDNSTCP      = "dns-tcp"
	SocketDNSUDP6     = "dns-udp6" // dns-proxy, IPv6
	SocketDNSTCP6     = "dns-tcp6"
	SocketProbe       = "probe" // the prober: app probes forwarded by agentd's status server
)

// Bus topics. Every topic carries state, not events: the bus keeps its last message.
const (
	TopicNameTable      = "name-table"      // xds-proxy → dns-proxy: istio.networking.nds.v1.NameTable
	TopicWorkloadHealth = "workload-health" // prober → xds-proxy: WorkloadHealth
	TopicTrustBundle    = "trust-bundle"    // xds-proxy → sds-server: TrustBundle
)

// Type URLs of the payloads and of the xDS resources agentd's helpers intercept.
const (
	TypeNameTable      = "type.googleapis.com/istio.networking.nds.v1.NameTable"
	TypeProxyConfig    = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"
	TypeWorkloadHealth = "type.googleapis.com/agentd.agent.v1.WorkloadHealth"
	TypeTrustBundle    = "type.googleapis.com/agentd.agent.v1.TrustBundle"
)

// TopicPayloads is the payload type of each topic: the bus refuses a message of another type,
// so one broken publisher cannot hand every subscriber something it cannot decode.
var TopicPayloads = map[string]string{
	TopicNameTable:      TypeNameTable,
	TopicWorkloadHealth: TypeWorkloadHealth,
	TopicTrustBundle:    TypeTrustBundle,
}

// MaxBusMessage is the largest message a helper may publish: gRPC's default of 4 MiB would
// refuse the name table of a mesh of about 50 000 names (measured: 60 000 names are 4.6 MB).
const MaxBusMessage = 64 << 20
