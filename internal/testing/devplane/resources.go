package devplane

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// Resource generators, chosen by the GENERATOR key of the node metadata as istiod does:
// proxyless gRPC clients get api_listener listeners, everything else Envoy's.
const (
	generatorGRPC  = "grpc"
	generatorEnvoy = "envoy"
)

// Names istiod uses.
const (
	virtualOutboundListener = "virtualOutbound"
	passthroughCluster      = "PassthroughCluster"
	virtualOutboundPort     = 15001
)

// clusterName is istiod's outbound cluster name, also the EDS service name.
func clusterName(host string, port uint32) string {
	return fmt.Sprintf("outbound|%d||%s", port, host)
}

// hostPort is the listener and route name istiod gives proxyless clients: the xds:/// target.
func hostPort(host string, port uint32) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

func isHTTP(p Port) bool { return p.Protocol != "TCP" }

// adsSource is the config source of every dynamic resource: the ADS stream itself.
func adsSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", m, err)) // only known, registered types reach here
	}
	return a
}

// resources returns the xDS resources of one generator for services.
func resources(generator string, services []Service) map[resourcev3.Type][]types.Resource {
	out := map[resourcev3.Type][]types.Resource{}
	add := func(typ resourcev3.Type, r types.Resource) { out[typ] = append(out[typ], r) }
	for _, s := range services {
		for _, p := range s.Ports {
			add(resourcev3.ClusterType, edsCluster(s, p))
			add(resourcev3.EndpointType, loadAssignment(s, p))
			if generator == generatorGRPC {
				add(resourcev3.ListenerType, apiListener(s, p))
				add(resourcev3.RouteType, grpcRoute(s, p))
			}
		}
	}
	if generator == generatorEnvoy {
		for _, l := range envoyListeners(services) {
			add(resourcev3.ListenerType, l)
		}
		for _, r := range envoyRoutes(services) {
			add(resourcev3.RouteType, r)
		}
		add(resourcev3.ClusterType, &clusterv3.Cluster{
			Name:                 passthroughCluster,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
			LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
			ConnectTimeout:       durationpb.New(10e9),
		})
	}
	return out
}

func edsCluster(s Service, p Port) *clusterv3.Cluster {
	name := clusterName(s.Hostname, p.Port)
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsSource(), ServiceName: name},
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		ConnectTimeout:       durationpb.New(10e9),
	}
	if p.Protocol == "GRPC" || p.Protocol == "HTTP2" {
		c.TypedExtensionProtocolOptions = map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpv3.HttpProtocolOptions{
				UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
					ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
						ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
							Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
						},
					},
				},
			}),
		}
	}
	return c
}

func loadAssignment(s Service, p Port) *endpointv3.ClusterLoadAssignment {
	lbs := make([]*endpointv3.LbEndpoint, 0, len(s.Endpoints))
	for _, e := range s.Endpoints {
		lbs = append(lbs, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddress(e.Address, e.portFor(p)),
			}},
			HealthStatus:        corev3.HealthStatus_HEALTHY,
			LoadBalancingWeight: wrapperspb.UInt32(1),
		})
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: clusterName(s.Hostname, p.Port)}
	if len(lbs) > 0 {
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{
			Locality:            &corev3.Locality{},
			LbEndpoints:         lbs,
			LoadBalancingWeight: wrapperspb.UInt32(uint32(len(lbs))),
		}}
	}
	return cla
}

func socketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       ip,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

func routerFilter() *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{
		Name:       "envoy.filters.http.router",
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
	}
}

func rdsManager(statPrefix, routeName string) *hcmv3.HttpConnectionManager {
	return &hcmv3.HttpConnectionManager{
		StatPrefix: statPrefix,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: routeName,
		}},
		HttpFilters: []*hcmv3.HttpFilter{routerFilter()},
	}
}

// apiListener is the listener a proxyless gRPC client asks for when it dials xds:///host:port.
func apiListener(s Service, p Port) *listenerv3.Listener {
	name := hostPort(s.Hostname, p.Port)
	return &listenerv3.Listener{
		Name:        name,
		ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(rdsManager(name, name))},
	}
}

func grpcRoute(s Service, p Port) *routev3.RouteConfiguration {
	name := hostPort(s.Hostname, p.Port)
	return &routev3.RouteConfiguration{
		Name:         name,
		VirtualHosts: []*routev3.VirtualHost{virtualHost(s, p, []string{s.Hostname, name})},
	}
}

func virtualHost(s Service, p Port, domains []string) *routev3.VirtualHost {
	return &routev3.VirtualHost{
		Name:    hostPort(s.Hostname, p.Port),
		Domains: domains,
		Routes: []*routev3.Route{{
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{
				ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: clusterName(s.Hostname, p.Port)},
			}},
		}},
	}
}

// envoyListeners are a sidecar's outbound listeners as istiod shapes them: the virtual
// outbound listener on 15001 hands connections to 0.0.0.0_<port> (HTTP ports, routed by
// RDS) or <vip>_<port> (TCP ports), none of which binds a socket of its own.
func envoyListeners(services []Service) []types.Resource {
	out := []types.Resource{&listenerv3.Listener{
		Name:           virtualOutboundListener,
		Address:        socketAddress("0.0.0.0", virtualOutboundPort),
		UseOriginalDst: wrapperspb.Bool(true),
		FilterChains:   []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{tcpProxy(passthroughCluster, passthroughCluster)}}},
	}}
	httpPorts := map[uint32]bool{}
	for _, s := range services {
		for _, p := range s.Ports {
			if isHTTP(p) {
				if !httpPorts[p.Port] {
					httpPorts[p.Port] = true
					out = append(out, httpListener(p.Port))
				}
				continue
			}
			for _, vip := range s.Addresses {
				out = append(out, &listenerv3.Listener{
					Name:       fmt.Sprintf("%s_%d", vip, p.Port),
					Address:    socketAddress(vip, p.Port),
					BindToPort: wrapperspb.Bool(false),
					FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{
						tcpProxy(clusterName(s.Hostname, p.Port), clusterName(s.Hostname, p.Port)),
					}}},
				})
			}
		}
	}
	return out
}

func httpListener(port uint32) *listenerv3.Listener {
	name := fmt.Sprintf("0.0.0.0_%d", port)
	return &listenerv3.Listener{
		Name:       name,
		Address:    socketAddress("0.0.0.0", port),
		BindToPort: wrapperspb.Bool(false),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager",
			ConfigType: &listenerv3.Filter_TypedConfig{
				TypedConfig: mustAny(rdsManager("outbound_"+name, strconv.Itoa(int(port)))),
			},
		}}}},
	}
}

func tcpProxy(statPrefix, cluster string) *listenerv3.Filter {
	return &listenerv3.Filter{
		Name: "envoy.filters.network.tcp_proxy",
		ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxyv3.TcpProxy{
			StatPrefix:       statPrefix,
			ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: cluster},
		})},
	}
}

// envoyRoutes are istiod's outbound route configurations: one per HTTP port, named for the
// port, with a virtual host per service answering its hostname, short names and VIPs.
func envoyRoutes(services []Service) []types.Resource {
	byPort := map[uint32]*routev3.RouteConfiguration{}
	var out []types.Resource
	for _, s := range services {
		for _, p := range s.Ports {
			if !isHTTP(p) {
				continue
			}
			rc, ok := byPort[p.Port]
			if !ok {
				rc = &routev3.RouteConfiguration{Name: strconv.Itoa(int(p.Port))}
				byPort[p.Port] = rc
				out = append(out, rc)
			}
			rc.VirtualHosts = append(rc.VirtualHosts, virtualHost(s, p, envoyDomains(s, p)))
		}
	}
	return out
}

func envoyDomains(s Service, p Port) []string {
	names := []string{s.Hostname}
	if s.Registry == registryKubernetes && s.Namespace != "" {
		short := strings.SplitN(s.Hostname, ".", 2)[0]
		names = append(names, short+"."+s.Namespace, short+"."+s.Namespace+".svc", short)
	}
	var domains []string
	for _, n := range append(names, s.Addresses...) {
		domains = append(domains, n, hostPort(n, p.Port))
	}
	return domains
}

// nameTable is the NDS table istiod would send for services: every hostname with its VIPs;
// Kubernetes services also carry their short name and namespace.
func nameTable(services []Service) *ndsv1.NameTable {
	nt := &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{}}
	for _, s := range services {
		if len(s.Addresses) == 0 {
			continue
		}
		info := &ndsv1.NameTable_NameInfo{Ips: s.Addresses, Registry: s.Registry}
		if s.Registry == registryKubernetes {
			info.Shortname = strings.SplitN(s.Hostname, ".", 2)[0]
			info.Namespace = s.Namespace
		}
		nt.Table[s.Hostname] = info
	}
	return nt
}
