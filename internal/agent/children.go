package agent

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/supervisor"
)

// buildChildren returns the child table; children stop in the reverse order. The prober first,
// so that it stops last: kubelet's probes reach it from the start and it answers them until
// the very end of a stop. Then sds-server (Envoy still needs certificates while it drains),
// xds-proxy, dns-proxy, and Envoy last, so that it stops first. The helpers start side by
// side: each needs nothing from the others to start (the bus replays what one waits for, and
// xds-proxy reads a client certificate file at each handshake, so one written later is used
// at the next). Envoy starts once the helpers it connects to are ready (envoy.go). Each
// child's entry is built in its own file here.
func (a *Agent) buildChildren() ([]supervisor.Child, error) {
	var out []supervisor.Child
	for _, build := range []func() (*supervisor.Child, error){
		a.prober, a.sdsServer, a.xdsProxy, a.dnsProxy, a.envoy,
	} {
		c, err := build()
		if err != nil {
			return nil, err
		}
		if c != nil { // nil: turned off by configuration
			out = append(out, *c)
		}
	}
	return out, nil
}

// helper is the child entry of a helper binary named name in the helpers directory.
func (a *Agent) helper(name string, config proto.Message, sockets ...supervisor.Socket) *supervisor.Child {
	names := make([]string, len(sockets))
	for i, s := range sockets {
		names[i] = s.Name
	}
	return &supervisor.Child{
		Name:    name,
		Binary:  filepath.Join(a.opts.HelpersDir, name),
		Sockets: sockets,
		Launch: func(ctx context.Context, binary string, files []*os.File) (supervisor.Instance, error) {
			return component.Start(ctx, component.Spec{
				Name:         name,
				Binary:       binary,
				Files:        files,
				Sockets:      names,
				Env:          helperEnv(name, a.opts.Env),
				Config:       config,
				Root:         a.opts.Root,
				Bus:          a.bus.Server(),
				Log:          a.log,
				StartTimeout: 10 * time.Second,
			})
		},
	}
}
