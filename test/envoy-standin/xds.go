package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3" // validated in LDS
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/testing/configcheck"
)

const (
	typeCDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	typeLDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
	typeEDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	typeRDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	typeSDS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
)

// statPrefix is where Envoy counts the updates of each type.
var statPrefix = map[string]string{
	typeCDS:  "cluster_manager.cds",
	typeLDS:  "listener_manager.lds",
	typeEDS:  "cluster_manager.eds",
	typeRDS:  "http.rds",
	typeSDS:  "sds",
	typeECDS: "extension_config_discovery", // Envoy counts per filter; the stand-in per type
}

// dial connects to a Unix socket path (relative to the working directory, as Envoy's pipes).
func dial(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}))
}

// retry runs session until ctx ends, again after each failure with a growing delay.
func retry(ctx context.Context, what string, session func(context.Context) error) {
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := session(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 5*time.Second {
			delay = 100 * time.Millisecond
		}
		logf("warning", "config", "%s stream closed: %v; retrying in %v", what, err, delay)
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// xdsClient is the ADS client: CDS and LDS (wildcard), EDS and RDS (the names they need).
type xdsClient struct {
	s     *server
	path  string
	delta bool

	accepted  map[string]map[string]*anypb.Any // by type, by name
	versions  map[string]string                // SotW version per type
	resVers   map[string]map[string]string     // delta versions per type and name
	subs      map[string][]string              // names wanted for EDS and RDS
	seen      map[string]bool                  // types accepted at least once
	listeners map[string]bool                  // LDS listeners bound, by name
}

func newXDSClient(s *server, path string, delta bool) *xdsClient {
	c := &xdsClient{s: s, path: path, delta: delta, accepted: map[string]map[string]*anypb.Any{}, versions: map[string]string{},
		resVers: map[string]map[string]string{}, subs: map[string][]string{}, seen: map[string]bool{}, listeners: map[string]bool{}}
	for _, t := range []string{typeCDS, typeLDS, typeEDS, typeRDS, typeECDS} {
		c.accepted[t], c.resVers[t] = map[string]*anypb.Any{}, map[string]string{}
	}
	return c
}

func (c *xdsClient) run(ctx context.Context) {
	mode := "SotW"
	if c.delta {
		mode = "delta"
	}
	logf("info", "upstream", "ADS (%s) over unix:%s", mode, c.path)
	retry(ctx, "ADS", func(ctx context.Context) error {
		conn, err := dial(c.path)
		if err != nil {
			return err
		}
		defer conn.Close()
		ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if c.delta {
			return c.deltaSession(ctx, ads)
		}
		return c.sotwSession(ctx, ads)
	})
}

// update is one ADS response, SotW or delta.
type update struct {
	typeURL, version, nonce string
	resources               []*anypb.Any
	names                   []string // delta: the names of resources
	versions                []string // delta: the versions of resources
	removed                 []string
}

func (c *xdsClient) sotwSession(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient) error {
	st, err := ads.StreamAggregatedResources(ctx, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	first := true
	send := func(r *discoveryv3.DiscoveryRequest) error {
		if first {
			r.Node, first = c.s.bootstrap.GetNode(), false
		}
		return st.Send(r)
	}
	request := func(t string) error {
		return send(&discoveryv3.DiscoveryRequest{TypeUrl: t, VersionInfo: c.versions[t], ResourceNames: c.subs[t]})
	}
	for _, t := range c.wanted() {
		if err := request(t); err != nil {
			return err
		}
	}
	c.s.stats.set("control_plane.connected_state", 1)
	defer c.s.stats.set("control_plane.connected_state", 0)
	for {
		resp, err := st.Recv()
		if err != nil {
			return err
		}
		u := update{typeURL: resp.GetTypeUrl(), version: resp.GetVersionInfo(), nonce: resp.GetNonce(), resources: resp.GetResources()}
		changed, verr := c.apply(u, false)
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: u.typeURL, VersionInfo: c.versions[u.typeURL], ResourceNames: c.subs[u.typeURL], ResponseNonce: u.nonce}
		if verr != nil {
			ack.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: verr.Error()}
		}
		if err := send(ack); err != nil {
			return err
		}
		for _, t := range changed {
			if err := request(t); err != nil {
				return err
			}
		}
	}
}

func (c *xdsClient) deltaSession(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient) error {
	st, err := ads.DeltaAggregatedResources(ctx, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	first := true
	send := func(r *discoveryv3.DeltaDiscoveryRequest) error {
		if first {
			r.Node, first = c.s.bootstrap.GetNode(), false
		}
		return st.Send(r)
	}
	sent := map[string][]string{}
	subscribe := func(t string) error {
		r := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t}
		if _, ok := sent[t]; !ok {
			r.InitialResourceVersions = c.resVers[t]
		}
		for _, n := range c.subs[t] {
			if !slices.Contains(sent[t], n) {
				r.ResourceNamesSubscribe = append(r.ResourceNamesSubscribe, n)
			}
		}
		for _, n := range sent[t] {
			if !slices.Contains(c.subs[t], n) {
				r.ResourceNamesUnsubscribe = append(r.ResourceNamesUnsubscribe, n)
			}
		}
		sent[t] = c.subs[t]
		return send(r)
	}
	for _, t := range c.wanted() {
		if err := subscribe(t); err != nil {
			return err
		}
	}
	c.s.stats.set("control_plane.connected_state", 1)
	defer c.s.stats.set("control_plane.connected_state", 0)
	for {
		resp, err := st.Recv()
		if err != nil {
			return err
		}
		u := update{typeURL: resp.GetTypeUrl(), version: resp.GetSystemVersionInfo(), nonce: resp.GetNonce(), removed: resp.GetRemovedResources()}
		for _, r := range resp.GetResources() {
			u.resources = append(u.resources, r.GetResource())
			u.names = append(u.names, r.GetName())
			u.versions = append(u.versions, r.GetVersion())
		}
		changed, verr := c.apply(u, true)
		ack := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: u.typeURL, ResponseNonce: u.nonce}
		if verr != nil {
			ack.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: verr.Error()}
		}
		if err := send(ack); err != nil {
			return err
		}
		for _, t := range changed {
			if err := subscribe(t); err != nil {
				return err
			}
		}
	}
}

// wanted are the types to request: CDS and LDS always, EDS, RDS and ECDS once names are known.
func (c *xdsClient) wanted() []string {
	t := []string{typeCDS, typeLDS}
	for _, named := range []string{typeEDS, typeRDS, typeECDS} {
		if len(c.subs[named]) > 0 {
			t = append(t, named)
		}
	}
	return t
}

// apply validates an update and applies it when every resource is valid (else it is
// rejected whole, as Envoy does); it returns the types whose subscriptions changed.
func (c *xdsClient) apply(u update, delta bool) (changed []string, err error) {
	prefix := statPrefix[u.typeURL]
	if prefix == "" {
		logf("warning", "config", "ignoring a response of unknown type %s", u.typeURL)
		return nil, fmt.Errorf("type %s is not subscribed", u.typeURL)
	}
	c.s.stats.add(prefix+".update_attempt", 1)
	decoded := map[string]*anypb.Any{}
	for i, a := range u.resources {
		name, err := resourceName(a)
		if err == nil {
			err = validateResource(a)
		}
		if err != nil {
			c.s.stats.add(prefix+".update_rejected", 1)
			logf("warning", "config", "gRPC config for %s rejected: %v", u.typeURL, err)
			return nil, err
		}
		if delta && u.names[i] != "" {
			name = u.names[i]
		}
		decoded[name] = a
	}
	if !delta {
		c.accepted[u.typeURL] = decoded
		c.versions[u.typeURL] = u.version
	} else {
		for _, n := range sortedNames(decoded) {
			c.accepted[u.typeURL][n] = decoded[n]
		}
		for i, n := range u.names {
			c.resVers[u.typeURL][n] = u.versions[i]
		}
		for _, n := range u.removed {
			delete(c.accepted[u.typeURL], n)
			delete(c.resVers[u.typeURL], n)
		}
	}
	c.s.stats.add(prefix+".update_success", 1)
	c.s.stats.set(prefix+".version", uint64(len(c.accepted[u.typeURL])))
	logf("info", "upstream", "%s: %d resources accepted (version %q)", shortType(u.typeURL), len(c.accepted[u.typeURL]), u.version)
	c.seen[u.typeURL] = true
	switch u.typeURL {
	case typeCDS:
		if c.resubscribe(typeEDS, edsNames(c.accepted[typeCDS])) {
			changed = append(changed, typeEDS)
		}
		c.s.stats.set("cluster_manager.active_clusters", uint64(len(c.accepted[typeCDS])+len(c.s.bootstrap.GetStaticResources().GetClusters())))
	case typeLDS:
		if c.resubscribe(typeRDS, rdsNames(c.accepted[typeLDS])) {
			changed = append(changed, typeRDS)
		}
		if c.resubscribe(typeECDS, ecdsNames(c.accepted[typeLDS])) {
			changed = append(changed, typeECDS)
		}
		c.applyListeners()
	}
	if c.seen[typeCDS] && c.seen[typeLDS] {
		c.s.markLive()
	}
	return changed, nil
}

func (c *xdsClient) resubscribe(t string, names []string) bool {
	if slices.Equal(c.subs[t], names) {
		return false
	}
	c.subs[t] = names
	return true
}

// applyListeners binds the LDS listeners that have a port and closes the removed ones.
func (c *xdsClient) applyListeners() {
	want := map[string]*listenerv3.Listener{}
	for name, a := range c.accepted[typeLDS] {
		l := &listenerv3.Listener{}
		if a.UnmarshalTo(l) == nil && l.GetAddress().GetSocketAddress().GetPortValue() != 0 &&
			(l.GetBindToPort() == nil || l.GetBindToPort().GetValue()) {
			want[name] = l
		}
	}
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	for name, tl := range c.s.listeners {
		if want[name] == nil && !strings.HasPrefix(name, "static/") {
			go tl.close()
			delete(c.s.listeners, name)
		}
	}
	for name, l := range want {
		if _, ok := c.s.listeners[name]; ok || c.s.draining {
			continue
		}
		tl, err := c.s.startTCPListener(l)
		if err != nil {
			c.s.stats.add("listener_manager.listener_create_failure", 1)
			logf("warning", "config", "listener '%s' failed to listen: %v", name, err)
			continue
		}
		c.s.listeners[name] = tl
	}
	c.s.stats.set("listener_manager.total_listeners_active", uint64(len(c.s.listeners)))
}

func sortedNames(m map[string]*anypb.Any) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func shortType(t string) string { return t[strings.LastIndex(t, ".")+1:] }

// resourceName is the name a resource is known by.
func resourceName(a *anypb.Any) (string, error) {
	m, err := a.UnmarshalNew()
	if err != nil {
		return "", fmt.Errorf("decode %s: %w", a.GetTypeUrl(), err)
	}
	switch r := m.(type) {
	case *clusterv3.Cluster:
		return r.GetName(), nil
	case *listenerv3.Listener:
		return r.GetName(), nil
	case *endpointv3.ClusterLoadAssignment:
		return r.GetClusterName(), nil
	case *routev3.RouteConfiguration:
		return r.GetName(), nil
	case *tlsv3.Secret:
		return r.GetName(), nil
	case *corev3.TypedExtensionConfig:
		return r.GetName(), nil
	}
	return "", fmt.Errorf("unexpected resource type %s", a.GetTypeUrl())
}

// validateResource runs the resource's validation rules and those of everything packed in
// it whose type the stand-in knows (Istio's own filters are not checked).
func validateResource(a *anypb.Any) error {
	m, err := a.UnmarshalNew()
	if err != nil {
		return err
	}
	if err := configcheck.ValidateKnown(m); err != nil {
		return err
	}
	return checkWasm(m)
}

// edsNames are the EDS service names of the EDS clusters.
func edsNames(clusters map[string]*anypb.Any) []string {
	var names []string
	for _, a := range clusters {
		c := &clusterv3.Cluster{}
		if a.UnmarshalTo(c) != nil || c.GetType() != clusterv3.Cluster_EDS {
			continue
		}
		n := c.GetEdsClusterConfig().GetServiceName()
		if n == "" {
			n = c.GetName()
		}
		names = append(names, n)
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// rdsNames are the route configurations the listeners' HTTP connection managers fetch by RDS.
func rdsNames(listeners map[string]*anypb.Any) []string {
	var names []string
	for _, a := range listeners {
		l := &listenerv3.Listener{}
		if a.UnmarshalTo(l) != nil {
			continue
		}
		chains := l.GetFilterChains()
		if l.GetDefaultFilterChain() != nil {
			chains = append(chains, l.GetDefaultFilterChain())
		}
		for _, fc := range chains {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) == nil && hcm.GetRds() != nil {
					names = append(names, hcm.GetRds().GetRouteConfigName())
				}
			}
		}
		if api := l.GetApiListener().GetApiListener(); api != nil {
			hcm := &hcmv3.HttpConnectionManager{}
			if api.UnmarshalTo(hcm) == nil && hcm.GetRds() != nil {
				names = append(names, hcm.GetRds().GetRouteConfigName())
			}
		}
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// sdsClient fetches the workload certificate and the root certificates over SDS, as an
// Istio sidecar's configuration makes Envoy do.
type sdsClient struct {
	s    *server
	path string
}

func newSDSClient(s *server, path string) *sdsClient { return &sdsClient{s: s, path: path} }

var sdsNames = []string{"default", "ROOTCA"}

func (c *sdsClient) run(ctx context.Context) {
	logf("info", "upstream", "SDS over unix:%s for %v", c.path, sdsNames)
	version := ""
	retry(ctx, "SDS", func(ctx context.Context) error {
		conn, err := dial(c.path)
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx, grpc.WaitForReady(true))
		if err != nil {
			return err
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: c.s.bootstrap.GetNode(), TypeUrl: typeSDS, VersionInfo: version, ResourceNames: sdsNames}); err != nil {
			return err
		}
		for {
			resp, err := st.Recv()
			if err != nil {
				return err
			}
			ack := &discoveryv3.DiscoveryRequest{TypeUrl: typeSDS, ResourceNames: sdsNames, ResponseNonce: resp.GetNonce(), VersionInfo: version}
			if err := c.check(resp.GetResources()); err != nil {
				logf("warning", "secret", "SDS update rejected: %v", err)
				ack.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
			} else {
				version = resp.GetVersionInfo()
				ack.VersionInfo = version
			}
			if err := st.Send(ack); err != nil {
				return err
			}
		}
	})
}

func (c *sdsClient) check(resources []*anypb.Any) error {
	var names []string
	for _, a := range resources {
		s := &tlsv3.Secret{}
		if err := a.UnmarshalTo(s); err != nil {
			return fmt.Errorf("decode secret: %w", err)
		}
		if err := configcheck.ValidateKnown(s); err != nil {
			return err
		}
		names = append(names, s.GetName())
	}
	for _, n := range names {
		c.s.stats.add("sds."+n+".update_success", 1)
	}
	logf("info", "secret", "SDS: secrets %v accepted", names)
	return nil
}
