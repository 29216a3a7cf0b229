package dnsproxy

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/errgroup"

	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/memory"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
	ndsv1 "github.com/agentd/agentd/proto/nds/v1"
)

// tableGrace is how long a starting dns-proxy leaves queries in the socket's queue while it
// waits for the bus to replay the current name table, so that a restarted process answers
// its first query from that table. A first start with no table yet then answers SERVFAIL.
const tableGrace = time.Second

// Helper is dns-proxy as an agentd helper: the server on the inherited sockets, fed with
// the name tables published on the bus.
type Helper struct {
	srv        *Server
	bus        *component.Bus
	log        hclog.Logger
	udp        []net.PacketConn
	tcp        []net.Listener
	firstTable chan struct{} // closed at the first name table
	once       sync.Once
}

// New builds dns-proxy from its environment: DNSProxyConfig, the inherited sockets and
// the bus.
func New(env *component.Env) (component.Helper, error) {
	var c agentv1.DNSProxyConfig
	if err := env.UnmarshalConfig(&c); err != nil {
		return nil, err
	}
	cfg, err := configFrom(&c)
	if err != nil {
		return nil, err
	}
	cfg.Log, cfg.Metrics, cfg.Journal = env.Log, env.Metrics, env.State()
	udp, tcp, err := inheritedSockets(env)
	if err != nil {
		return nil, err
	}
	return NewHelper(cfg, env.Bus, udp, tcp)
}

// NewHelper returns the helper serving on the given sockets, with tables from bus.
func NewHelper(cfg Config, bus *component.Bus, udp []net.PacketConn, tcp []net.Listener) (*Helper, error) {
	srv, err := NewServer(cfg)
	if err != nil {
		return nil, err
	}
	return &Helper{srv: srv, bus: bus, log: srv.log, udp: udp, tcp: tcp, firstTable: make(chan struct{})}, nil
}

// configFrom turns the helper's configuration into the server's, reading the resolv.conf.
func configFrom(c *agentv1.DNSProxyConfig) (Config, error) {
	rc, err := ReadResolvConf(c.GetResolvConf())
	if err != nil {
		return Config{}, err
	}
	search := rc.Search
	if len(c.GetSearchDomains()) > 0 {
		search = c.GetSearchDomains()
	}
	ns := c.GetPodNamespace()
	domain := c.GetProxyDomain()
	if domain == "" {
		domain = ns + ".svc.cluster.local"
	}
	return Config{
		Names:             Names{Namespace: ns, Domain: ProxyDomain(domain, ns), Search: search},
		Upstreams:         rc.Servers,
		ForwardTimeout:    c.GetForwardTimeout().AsDuration(),
		ForwardParallel:   c.GetForwardParallel(),
		RespondBeforeSync: c.GetRespondBeforeSync(),
	}, nil
}

func inheritedSockets(env *component.Env) ([]net.PacketConn, []net.Listener, error) {
	var udp []net.PacketConn
	var tcp []net.Listener
	for _, pair := range [][2]string{{agentv1.SocketDNSUDP, agentv1.SocketDNSTCP}, {agentv1.SocketDNSUDP6, agentv1.SocketDNSTCP6}} {
		if env.HasSocket(pair[0]) {
			pc, err := env.PacketConn(pair[0])
			if err != nil {
				return nil, nil, err
			}
			udp = append(udp, pc)
		}
		if env.HasSocket(pair[1]) {
			l, err := env.Listener(pair[1])
			if err != nil {
				return nil, nil, err
			}
			tcp = append(tcp, l)
		}
	}
	if len(udp)+len(tcp) == 0 {
		return nil, nil, fmt.Errorf("no DNS socket inherited: want %q and %q, or %q and %q", agentv1.SocketDNSUDP, agentv1.SocketDNSTCP, agentv1.SocketDNSUDP6, agentv1.SocketDNSTCP6)
	}
	return udp, tcp, nil
}

// Run serves DNS and follows the name table until ctx ends. Unless answers before the first
// table are wanted, serving starts at the first table or after tableGrace.
func (h *Helper) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if !h.srv.cfg.RespondBeforeSync {
			h.waitFirstTable(ctx)
		}
		return h.srv.Serve(ctx, h.udp, h.tcp)
	})
	g.Go(func() error { h.followNameTable(ctx); return nil })
	return g.Wait()
}

func (h *Helper) waitFirstTable(ctx context.Context) {
	t := time.NewTimer(tableGrace)
	defer t.Stop()
	select {
	case <-h.firstTable:
	case <-t.C:
		h.log.Info("no name table yet: answering SERVFAIL until it comes")
	case <-ctx.Done():
	}
}

// Ready returns an error until the first name table, as Istio's readiness does.
func (h *Helper) Ready() error { return h.srv.Ready() }

// followNameTable follows the name table on the bus until ctx ends. The bus replays the
// current table first, so a restarted dns-proxy answers from it at once.
func (h *Helper) followNameTable(ctx context.Context) {
	h.bus.Follow(ctx, agentv1.TopicNameTable, h.log, h.onNameTable)
}

func (h *Helper) onNameTable(m *agentv1.BusMessage) {
	var nt ndsv1.NameTable
	if err := m.GetPayload().UnmarshalTo(&nt); err != nil {
		h.log.Error("name table", "error", fmt.Errorf("decode bus message %d: %w", m.GetSequence(), err))
		return
	}
	if err := checkNameTable(&nt); err != nil {
		h.log.Error("name table refused, keeping the current one", "error", fmt.Errorf("bus message %d: %w", m.GetSequence(), err))
		return
	}
	start := time.Now()
	first := h.srv.table.Load() == nil
	t := h.srv.SetNameTable(&nt)
	h.once.Do(func() { close(h.firstTable) })
	h.log.Info("name table updated", "entries", t.Entries(), "names", t.Len(), "first", first, "build", time.Since(start))
	memory.Release() // a build's garbage is several times the table it leaves
}
