package component

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// ProtocolVersion is the version of the plugin contract this build speaks: the protos of
// proto/agent/v1 and what agentd and a helper exchange on the sockets agentd hands down (since
// version 2, the status server hands kubelet's probe connections to the prober over its
// socket). agentd refuses a helper built for another version, so a swap to an older build is
// refused rather than run.
const ProtocolVersion = 2

// pluginName is the one plugin every helper binary serves.
const pluginName = "component"

func handshake(version int) plugin.HandshakeConfig {
	return plugin.HandshakeConfig{
		ProtocolVersion: uint(version),
		// Not a secret: it only tells a helper binary run by hand that it must be run by agentd.
		MagicCookieKey:   "AGENTD_PLUGIN",
		MagicCookieValue: "f1b5e0c4-agentd-helper",
	}
}

// grpcPlugin is the go-plugin adapter of the Component service, for both sides.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	server agentv1.ComponentServer // helper side
}

func (p *grpcPlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	if cs, ok := p.server.(*childServer); ok {
		cs.broker = broker
	}
	agentv1.RegisterComponentServer(s, p.server)
	return nil
}

// hostSide is what the agentd side dispenses: the Component client and the broker the bus
// is served on.
type hostSide struct {
	client agentv1.ComponentClient
	broker *plugin.GRPCBroker
}

func (p *grpcPlugin) GRPCClient(_ context.Context, broker *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &hostSide{client: agentv1.NewComponentClient(c), broker: broker}, nil
}

func errVersion(name string, err error) error {
	return fmt.Errorf("helper %s does not speak plugin protocol %d (refused): %w", name, ProtocolVersion, err)
}
