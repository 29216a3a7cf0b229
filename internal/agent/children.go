package agent

import (
	"context"
	"os"
	"path/filepath"
	"time"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"

	"google.golang.org/protobuf/proto"

	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/envoy"
	"github.com/agentd/agentd/internal/envoy/bootstrap"
	"github.com/agentd/agentd/internal/settings"
	"github.com/agentd/agentd/internal/supervisor"
)

type socketSpec = supervisor.Socket

// configs are the children's configurations, each a pure function of the Settings (one file
// per child): what New checks before anything starts, and what the child table is built from.
type configs struct {
	xds      *agentv1.XDSProxyConfig
	sds      *agentv1.SDSConfig
	sdsSock  socketSpec
	dns      *agentv1.DNSProxyConfig // nil: DNS capture off, no dns-proxy
	dnsSocks []socketSpec
	prober   *agentv1.ProberConfig // nil: nothing to probe, no prober
	envoy    *bootstrap.Config     // nil: Envoy disabled
	envoyRun envoy.ProcessOptions
	warnings []string
}

// childTable is the child table; children stop in the reverse order. The prober first, so that
// it stops last: kubelet's probes reach it from the start and it answers them until the very
// end of a stop. Then sds-server (Envoy still needs certificates while it drains), xds-proxy,
// dns-proxy, and Envoy last, so that it stops first. They all start side by side: each needs
// nothing from the others to start (the bus replays what one waits for, xds-proxy reads a
// client certificate file at each handshake, so one written later is used at the next, and
// Envoy's first xDS and SDS streams wait in the queues of agentd's sockets, which listen
// before any child starts, until xds-proxy and sds-server serve them: pilot-agent too has its
// SDS server and xDS proxy listening before it starts Envoy, which then waits for answers).
func (a *Agent) childTable(c *configs) []supervisor.Child {
	var out []supervisor.Child
	if c.prober != nil {
		out = append(out, a.helper("prober", c.prober, socketSpec{Name: agentv1.SocketProbe, Network: "unix", Address: ProbeSocket}))
	}
	out = append(out,
		a.helper("sds-server", c.sds, c.sdsSock),
		a.helper("xds-proxy", c.xds, socketSpec{Name: agentv1.SocketXDS, Network: "unix", Address: settings.XDSSocket, Mode: 0o666}))
	if c.dns != nil {
		out = append(out, a.helper("dns-proxy", c.dns, c.dnsSocks...))
	}
	if c.envoy != nil {
		run := c.envoyRun
		run.Control, run.OnUnexpectedExit, run.Log = &a.envoyDrain, a.onEnvoyExit, a.log.Named("envoy")
		prepare := run.Prepare
		run.Prepare = func() error {
			if a.envoyExited.Load() { // the supervisor's restart, while agentd stops
				return errEnvoyExited
			}
			if prepare != nil {
				return prepare()
			}
			return nil
		}
		out = append(out, supervisor.Child{
			Name: "envoy", Binary: envoyBinary(a.s), Launch: envoy.Launch(run),
			DrainTimeout: envoyDrainTimeout(run),
			ReadyTimeout: envoyReadyTimeout,
		})
	}
	return out
}

// helper is the child entry of a helper binary named name in the helpers directory.
func (a *Agent) helper(name string, config proto.Message, sockets ...socketSpec) supervisor.Child {
	names := make([]string, len(sockets))
	for i, s := range sockets {
		names[i] = s.Name
	}
	return supervisor.Child{
		Name:    name,
		Binary:  filepath.Join(a.s.HelpersDir, name),
		Sockets: sockets,
		Launch: func(ctx context.Context, binary string, files []*os.File) (supervisor.Instance, error) {
			return component.Start(ctx, component.Spec{
				Name:         name,
				Binary:       binary,
				Files:        files,
				Sockets:      names,
				Env:          helperEnv(name, a.s.Environ),
				Config:       config,
				Root:         a.s.Root,
				Bus:          a.bus.Server(),
				Log:          a.log,
				StartTimeout: 10 * time.Second,
			})
		},
	}
}
