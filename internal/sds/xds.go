package sds

// The SDS service itself: secret/v3's SecretDiscoveryService over gRPC, state of the world
// (StreamSecrets) and incremental (DeltaSecrets), for the secrets this server holds.
//
// It replaces go-control-plane's LinearCache and xDS server, which link every Envoy config
// type (cluster, listener, route, ...) into agentd's binary, whose descriptors every process
// of the tree then registers at start. It keeps their behaviour for SDS:
//   - a request without resource names gets nothing (no legacy wildcard);
//   - a secret is versioned by the update that last changed it: the store's start time and a
//     counter (SotW), or the SHA-256 of its encoding (delta resource versions); a SotW response
//     carries the store's current version;
//   - a stream sends one response per request: it then waits for the ACK or NACK (a SotW
//     request with another nonce than the last response's is stale and ignored) and sends only
//     what changed since, so an ACK resends nothing;
//   - a NACK (error_detail) is logged and counted, the stream keeps serving and does not resend
//     the version the client refused;
//   - a secret not generated yet is generated before the request is answered (ensure), and an
//     update wakes every stream watching its name.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// typeSecret is the type URL of SDS resources.
const typeSecret = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

// store holds the secrets served by name and wakes the streams watching a name when it
// changes.
type store struct {
	// prefix starts every version: the start time, so that a version a client kept from an
	// earlier sds-server never matches one of this one (it is then answered in full).
	prefix string

	mu       sync.Mutex
	counter  uint64                              // bumped by every change
	secrets  map[string]*entry                   // entries are never modified, only replaced
	watchers map[string]map[*subscriber]struct{} // by secret name
}

// entry is one secret as it is sent: encoded once for every stream.
type entry struct {
	name    string
	any     *anypb.Any
	version string // SotW: prefix + counter of the change that set it
	hash    string // delta: hex SHA-256 of the deterministic encoding
}

func newStore(prefix string) *store {
	return &store{prefix: prefix, secrets: map[string]*entry{}, watchers: map[string]map[*subscriber]struct{}{}}
}

// set stores sec as name and wakes the streams watching it. It reports whether anything
// changed: an identical secret is not pushed again.
func (s *store) set(name string, sec *tlsv3.Secret) (bool, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(sec)
	if err != nil {
		return false, fmt.Errorf("encode secret %s: %w", name, err)
	}
	sum := sha256.Sum256(b)
	hash := hex.EncodeToString(sum[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.secrets[name]; ok && old.hash == hash {
		return false, nil
	}
	s.counter++
	s.secrets[name] = &entry{name: name, any: &anypb.Any{TypeUrl: typeSecret, Value: b}, version: s.version(), hash: hash}
	for w := range s.watchers[name] {
		w.notify()
	}
	return true, nil
}

// has reports whether name is held.
func (s *store) has(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.secrets[name]
	return ok
}

// version is the store's current version; s.mu is held.
func (s *store) version() string { return s.prefix + strconv.FormatUint(s.counter, 10) }

// watching is how many streams watch name (tests check that an ended stream lets go).
func (s *store) watching(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers[name])
}

// subscriber is one stream's subscription: the names it watches and the version of each
// that it was sent.
type subscriber struct {
	wake  chan struct{}       // holds one wake-up when a watched secret changed since the stream looked
	names map[string]struct{} // under store.mu
	sent  map[string]string   // owned by the stream's goroutine
}

func newSubscriber() *subscriber {
	return &subscriber{wake: make(chan struct{}, 1), names: map[string]struct{}{}, sent: map[string]string{}}
}

func (w *subscriber) notify() {
	select {
	case w.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// watch adds names to sub's subscription.
func (s *store) watch(sub *subscriber, names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		sub.names[n] = struct{}{}
		ws := s.watchers[n]
		if ws == nil {
			ws = map[*subscriber]struct{}{}
			s.watchers[n] = ws
		}
		ws[sub] = struct{}{}
	}
}

// unwatch removes names from sub's subscription and forgets what was sent of them, so that
// a later subscription sends them again.
func (s *store) unwatch(sub *subscriber, names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		delete(sub.names, n)
		delete(sub.sent, n)
		if ws := s.watchers[n]; ws != nil {
			delete(ws, sub)
			if len(ws) == 0 {
				delete(s.watchers, n)
			}
		}
	}
}

// subscribe makes sub watch exactly names (a SotW request names the whole subscription).
func (s *store) subscribe(sub *subscriber, names []string) {
	want := make(map[string]struct{}, len(names))
	for _, n := range names {
		want[n] = struct{}{}
	}
	var gone []string
	s.mu.Lock()
	for n := range sub.names {
		if _, ok := want[n]; !ok {
			gone = append(gone, n)
		}
	}
	s.mu.Unlock()
	s.unwatch(sub, gone...)
	s.watch(sub, names...)
}

// release ends every watch of sub, when its stream ends.
func (s *store) release(sub *subscriber) {
	s.mu.Lock()
	names := make([]string, 0, len(sub.names))
	for n := range sub.names {
		names = append(names, n)
	}
	s.mu.Unlock()
	s.unwatch(sub, names...)
}

// changed returns the watched secrets whose version differs from the one sub was sent
// (delta compares hashes, SotW versions), by name, records them as sent, and returns the
// store's version.
func (s *store) changed(sub *subscriber, delta bool) ([]*entry, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*entry
	for n := range sub.names {
		e, ok := s.secrets[n]
		if !ok {
			continue
		}
		v := e.version
		if delta {
			v = e.hash
		}
		if sub.sent[n] != v {
			sub.sent[n] = v
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *entry) int { return strings.Compare(a.name, b.name) })
	return out, s.version()
}

// sdsService serves secret/v3's SecretDiscoveryService from a store. FetchSecrets is
// Unimplemented, as Istio's.
type sdsService struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer
	store *store
	// ensure generates the named secrets that are not in the store yet; its error (a status)
	// ends the stream.
	ensure  func(ctx context.Context, names []string) error
	log     hclog.Logger
	m       *metrics
	rejects atomic.Int64 // NACKs received
}

// StreamSecrets serves one SotW stream: one goroutine answers requests and pushes changes,
// another receives.
func (x *sdsService) StreamSecrets(st secretv3.SecretDiscoveryService_StreamSecretsServer) error {
	ctx := st.Context()
	reqs := receive(ctx, st.Recv)
	sub := newSubscriber()
	defer x.store.release(sub)
	var (
		nonce     uint64
		lastNonce string // of the last response; "" before the first
		pending   bool   // a request waits for its response
		full      bool   // answer even with nothing changed
	)
	for {
		select {
		case <-ctx.Done():
			return nil
		case req, ok := <-reqs:
			if !ok {
				return nil
			}
			if lastNonce != "" && req.GetResponseNonce() != lastNonce {
				// The client has not seen the last response yet; it answers that one next.
				x.log.Trace("stale SDS request ignored", "nonce", req.GetResponseNonce(), "want", lastNonce)
				x.stale(req)
				continue
			}
			if err := checkType(req.GetTypeUrl()); err != nil {
				return err
			}
			nack := req.GetErrorDetail() != nil
			if nack {
				x.rejected(req.GetResourceNames(), req.GetVersionInfo(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
			}
			if err := x.ensure(ctx, req.GetResourceNames()); err != nil {
				return err
			}
			x.store.subscribe(sub, req.GetResourceNames())
			// A client without a version of this store (a first request, or one from an earlier
			// sds-server) is answered even with nothing: it waits for a response. A NACK is not:
			// it would refuse an empty answer again.
			pending, full = true, !nack && !strings.HasPrefix(req.GetVersionInfo(), x.store.prefix)
		case <-sub.wake:
		}
		if !pending {
			continue
		}
		entries, version := x.store.changed(sub, false)
		if len(entries) == 0 && !full {
			continue
		}
		nonce++
		lastNonce = strconv.FormatUint(nonce, 10)
		resp := &discoveryv3.DiscoveryResponse{VersionInfo: version, TypeUrl: typeSecret, Nonce: lastNonce,
			Resources: make([]*anypb.Any, len(entries))}
		for i, e := range entries {
			resp.Resources[i] = e.any
		}
		if err := x.send(func() error { return st.Send(resp) }); err != nil {
			return err
		}
		pending, full = false, false
	}
}

// DeltaSecrets serves one incremental stream: resources are subscribed and unsubscribed by
// name, and each response carries the changed secrets with their own versions.
func (x *sdsService) DeltaSecrets(st secretv3.SecretDiscoveryService_DeltaSecretsServer) error {
	ctx := st.Context()
	reqs := receive(ctx, st.Recv)
	sub := newSubscriber()
	defer x.store.release(sub)
	var (
		nonce   uint64
		first   = true
		pending bool
	)
	for {
		select {
		case <-ctx.Done():
			return nil
		case req, ok := <-reqs:
			if !ok {
				return nil
			}
			if err := checkType(req.GetTypeUrl()); err != nil {
				return err
			}
			if req.GetErrorDetail() != nil {
				x.rejected(nil, "", req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
			}
			if err := x.ensure(ctx, req.GetResourceNamesSubscribe()); err != nil {
				return err
			}
			x.store.unwatch(sub, req.GetResourceNamesUnsubscribe()...)
			x.store.watch(sub, req.GetResourceNamesSubscribe()...)
			if first {
				// What a reconnecting client already holds is not sent again unless it changed.
				for _, n := range req.GetResourceNamesSubscribe() {
					if v, ok := req.GetInitialResourceVersions()[n]; ok {
						sub.sent[n] = v
					}
				}
				first = false
			}
			pending = true
		case <-sub.wake:
		}
		if !pending {
			continue
		}
		entries, version := x.store.changed(sub, true)
		if len(entries) == 0 {
			continue
		}
		nonce++
		resp := &discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: version, TypeUrl: typeSecret,
			Nonce: strconv.FormatUint(nonce, 10), Resources: make([]*discoveryv3.Resource, len(entries))}
		for i, e := range entries {
			resp.Resources[i] = &discoveryv3.Resource{Name: e.name, Version: e.hash, Resource: e.any}
		}
		if err := x.send(func() error { return st.Send(resp) }); err != nil {
			return err
		}
		pending = false
	}
}

// stale counts a SotW request answering an older response than the last, as Istio counts
// istio_agent_pilot_xds_expired_nonce: one that names resources and carries a nonce (an
// empty nonce starts a subscription, no names end one).
func (x *sdsService) stale(req *discoveryv3.DiscoveryRequest) {
	if req.GetResponseNonce() != "" && len(req.GetResourceNames()) > 0 {
		x.m.expiredNonce.WithLabelValues(metricTypeSDS).Inc()
	}
}

// send sends one response and records how long it took (istio_agent_pilot_xds_send_time).
func (x *sdsService) send(f func() error) error {
	start := time.Now()
	err := f()
	x.m.sendTime.Observe(time.Since(start).Seconds())
	return err
}

// rejected logs and counts a NACK; the stream keeps serving what the client holds.
func (x *sdsService) rejected(names []string, version, nonce, msg string) {
	x.rejects.Add(1)
	args := []any{"nonce", nonce, "error", msg}
	if names != nil {
		args = append(args, "resources", names, "accepted_version", version)
	}
	x.log.Warn("client rejected secrets", args...)
}

// checkType refuses a request for another resource type; an empty type URL means secrets.
func checkType(typeURL string) error {
	if typeURL != "" && typeURL != typeSecret {
		return status.Errorf(codes.InvalidArgument, "SDS serves %s, not %s", typeSecret, typeURL)
	}
	return nil
}

// receive reads a stream's requests into a channel, so that the stream's goroutine waits on
// requests and changes at once. It ends when the stream fails or ends (ctx is the stream's:
// gRPC cancels it when the handler returns).
func receive[T any](ctx context.Context, recv func() (T, error)) <-chan T {
	ch := make(chan T)
	go func() {
		defer close(ch)
		for {
			r, err := recv()
			if err != nil {
				return
			}
			select {
			case ch <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}
