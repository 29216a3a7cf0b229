package xdsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/agentd/agentd/internal/component"
	"github.com/agentd/agentd/internal/wasm"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// Helper is xds-proxy as an agentd helper: the proxy on the inherited socket, with health
// reports from the bus.
type Helper struct {
	proxy   *Proxy
	l       net.Listener
	bus     *component.Bus
	wasm    *wasm.Cache // nil when ECDS is forwarded untouched
	serving atomic.Bool
}

// New builds xds-proxy from its environment: XDSProxyConfig, the "xds" socket and the bus.
func New(env *component.Env) (component.Helper, error) {
	var c agentv1.XDSProxyConfig
	if err := env.UnmarshalConfig(&c); err != nil {
		return nil, err
	}
	l, err := env.Listener(agentv1.SocketXDS)
	if err != nil {
		return nil, err
	}
	cfg := configFrom(&c)
	var cache *wasm.Cache
	if !c.GetWasm().GetConversionDisabled() {
		if cache, err = NewWasmCache(c.GetWasm(), env.Log.Named("wasm"), env.Metrics); err != nil {
			return nil, errors.Join(err, l.Close())
		}
		cfg.Wasm = wasm.NewConverter(cache)
	}
	p, err := NewProxy(cfg, env.Log, env.Bus, env.Metrics)
	if err != nil {
		return nil, errors.Join(err, l.Close())
	}
	h := NewHelper(p, l, env.Bus)
	h.wasm = cache
	return h, nil
}

// NewWasmCache builds the Wasm module cache of c; a blocked range that does not parse is
// skipped with a warning, as Istio skips it.
func NewWasmCache(c *agentv1.WasmConfig, log hclog.Logger, reg prometheus.Registerer) (*wasm.Cache, error) {
	o := wasm.Options{
		Dir:                   c.GetCacheDir(),
		PurgeInterval:         c.GetPurgeInterval().AsDuration(),
		ModuleExpiry:          c.GetModuleExpiry().AsDuration(),
		InsecureRegistries:    c.GetInsecureRegistries(),
		HTTPRequestTimeout:    c.GetHttpRequestTimeout().AsDuration(),
		HTTPRequestMaxRetries: int(c.GetHttpRequestMaxRetries()),
		MaxBinarySize:         c.GetMaxBinarySizeBytes(),
	}
	for _, s := range c.GetBlockedCidrs() {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			log.Warn("ignoring a blocked range that does not parse (BLOCKED_CIDRS_IN_WASM_FETCH)", "cidr", s, "error", err)
			continue
		}
		o.BlockedCIDRs = append(o.BlockedCIDRs, p.Masked())
	}
	m, err := wasm.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	return wasm.NewCache(o, log, m)
}

// NewHelper returns the helper serving p on l, with health reports from bus.
func NewHelper(p *Proxy, l net.Listener, bus *component.Bus) *Helper {
	return &Helper{proxy: p, l: l, bus: bus}
}

// configFrom turns the helper's configuration into the proxy's.
func configFrom(c *agentv1.XDSProxyConfig) Config {
	return Config{
		Upstream: Upstream{
			Address:   c.GetDiscoveryAddress(),
			ClusterID: c.GetClusterId(),
			Headers:   c.GetHeaders(),
			TLS:       c.GetTls(),
			RootCert:  c.GetRootCert(),
			SAN:       c.GetIstiodSan(),
			CertChain: c.GetCertChain(),
			Key:       c.GetKey(),
			TokenPath: c.GetTokenPath(),
		},
		NameTable:   c.GetNameTable(),
		ProxyConfig: c.GetProxyConfig(),
	}
}

// Run serves clients and passes the workload's health reports upstream until ctx ends.
func (h *Helper) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	if h.wasm != nil {
		g.Go(func() error { return h.wasm.Run(ctx) })
	}
	g.Go(func() error {
		h.serving.Store(true)
		return h.proxy.Serve(ctx, h.l)
	})
	g.Go(func() error {
		h.bus.Follow(ctx, agentv1.TopicWorkloadHealth, h.proxy.log, func(m *agentv1.BusMessage) {
			var health agentv1.WorkloadHealth
			if err := m.GetPayload().UnmarshalTo(&health); err != nil {
				h.proxy.log.Error("ignoring a health report that does not decode", "error", err)
				return
			}
			h.proxy.SetHealth(&health)
		})
		return nil
	})
	return g.Wait()
}

// Ready is nil once the proxy serves its socket.
func (h *Helper) Ready() error {
	if !h.serving.Load() {
		return fmt.Errorf("not serving %s yet", agentv1.SocketXDS)
	}
	return nil
}

// Drain hands new streams to the next xds-proxy (a swap) while the open ones continue.
func (h *Helper) Drain(ctx context.Context) error { return h.proxy.Drain(ctx) }
