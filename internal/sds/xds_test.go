package sds

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// What go-control-plane's LinearCache and xDS server did for sds-server, now xds.go's: ACKs,
// NACKs, stale nonces, several streams on one name, delta subscriptions, watches released
// when a stream ends.

// quietFor is how long a stream must stay silent where nothing is due.
const quietFor = 300 * time.Millisecond

// xdsFixture is a files-only server serving two file-cert secrets, a and b, whose content a
// test changes with change.
type xdsFixture struct {
	s     *sdsUnderTest
	conn  *grpc.ClientConn
	a, b  string
	pairs []keyPair
}

func newXDSFixture(t *testing.T) *xdsFixture {
	t.Helper()
	c := mustCA(t)
	dir := t.TempDir()
	f := &xdsFixture{pairs: []keyPair{newPair(t, c, "spiffe://td/a"), newPair(t, c, "spiffe://td/b")}}
	for _, n := range []string{"a", "b"} {
		cert, key := filepath.Join(dir, n+"-cert.pem"), filepath.Join(dir, n+"-key.pem")
		write(t, cert, f.pairs[0].cert)
		write(t, key, f.pairs[0].key)
		if n == "a" {
			f.a = FileCertResource(cert, key)
		} else {
			f.b = FileCertResource(cert, key)
		}
	}
	f.s = startSDS(t, Options{FilesOnly: true})
	f.conn = dial(t, f.s.sock)
	return f
}

// change serves pair i as name, as a file change would.
func (f *xdsFixture) change(name string, i int) {
	f.s.publish(name, certSecret(name, f.pairs[i].cert, f.pairs[i].key))
}

// hasPair checks that resources hold exactly the named secrets, each with pair i.
func (f *xdsFixture) hasPair(t *testing.T, resources []*anypb.Any, i int, names ...string) {
	t.Helper()
	var got []string
	for _, a := range resources {
		s := &tlsv3.Secret{}
		if err := a.UnmarshalTo(s); err != nil {
			t.Fatalf("decode secret: %v", err)
		}
		got = append(got, s.GetName())
		if !bytes.Equal(certOf(s), f.pairs[i].cert) {
			t.Errorf("secret %s does not hold pair %d", s.GetName(), i)
		}
	}
	slices.Sort(got)
	slices.Sort(names)
	if !slices.Equal(got, names) {
		t.Errorf("response holds %v, want %v", got, names)
	}
}

func nextResponse[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case r, ok := <-ch:
		if !ok {
			t.Fatal("the stream ended")
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no response within 10s")
	}
	panic("unreachable")
}

func noResponse[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case r, ok := <-ch:
		if ok {
			t.Fatalf("%s: got a response, want none: %v", what, r)
		}
	case <-time.After(quietFor):
	}
}

// sotwClient is a SotW stream whose requests the test writes one by one.
type sotwClient struct {
	t      *testing.T
	st     secretv3.SecretDiscoveryService_StreamSecretsClient
	resps  <-chan *discoveryv3.DiscoveryResponse
	cancel context.CancelFunc
}

func openSotW(t *testing.T, conn *grpc.ClientConn) *sotwClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &sotwClient{t: t, st: st, resps: receive(ctx, st.Recv), cancel: cancel}
}

func (c *sotwClient) send(names []string, version, nonce string, nack *rpcstatus.Status) {
	c.t.Helper()
	err := c.st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: names,
		VersionInfo: version, ResponseNonce: nonce, ErrorDetail: nack})
	if err != nil {
		c.t.Fatalf("send SDS request: %v", err)
	}
}

// TestSotWAckResendsNothing: an ACK gets no answer; the next change is pushed with a new
// version and nonce.
func TestSotWAckResendsNothing(t *testing.T) {
	f := newXDSFixture(t)
	c := openSotW(t, f.conn)
	c.send([]string{f.a}, "", "", nil)
	r1 := nextResponse(t, c.resps)
	f.hasPair(t, r1.GetResources(), 0, f.a)
	if !strings.HasPrefix(r1.GetVersionInfo(), f.s.secrets.prefix) || r1.GetNonce() == "" || r1.GetTypeUrl() != resourcev3.SecretType {
		t.Errorf("response version %q, nonce %q, type %q; want the store's version, a nonce and the secret type",
			r1.GetVersionInfo(), r1.GetNonce(), r1.GetTypeUrl())
	}
	c.send([]string{f.a}, r1.GetVersionInfo(), r1.GetNonce(), nil)
	noResponse(t, c.resps, "after an ACK")

	f.change(f.a, 1)
	r2 := nextResponse(t, c.resps)
	f.hasPair(t, r2.GetResources(), 1, f.a)
	if r2.GetVersionInfo() == r1.GetVersionInfo() || r2.GetNonce() == r1.GetNonce() {
		t.Errorf("a change was pushed with version %q nonce %q, the same as before", r2.GetVersionInfo(), r2.GetNonce())
	}
	c.send([]string{f.a}, r2.GetVersionInfo(), r2.GetNonce(), nil)
	f.change(f.a, 1) // the same secret again: nothing to push
	noResponse(t, c.resps, "after an unchanged secret")
}

// TestSotWStaleNonce: a request answering an older response is ignored; the ACK of the last
// one, with a new name, gets the new name only.
func TestSotWStaleNonce(t *testing.T) {
	f := newXDSFixture(t)
	c := openSotW(t, f.conn)
	c.send([]string{f.a}, "", "", nil)
	r1 := nextResponse(t, c.resps)
	c.send([]string{f.a, f.b}, "", "stale", nil)
	noResponse(t, c.resps, "after a stale request")
	c.send([]string{f.a, f.b}, r1.GetVersionInfo(), r1.GetNonce(), nil)
	f.hasPair(t, nextResponse(t, c.resps).GetResources(), 0, f.b)
}

// TestSotWNack: a NACK is counted and answered by nothing (not the refused version again,
// not an empty response the client would refuse again); the stream keeps serving changes.
func TestSotWNack(t *testing.T) {
	f := newXDSFixture(t)
	c := openSotW(t, f.conn)
	c.send([]string{f.a}, "", "", nil)
	r1 := nextResponse(t, c.resps)
	// Envoy NACKing its first response: no version accepted yet.
	c.send([]string{f.a}, "", r1.GetNonce(), &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "bad secret"})
	eventually(t, "the NACK to be counted", func() bool { return f.s.sds.rejects.Load() == 1 })
	noResponse(t, c.resps, "after a NACK")

	f.change(f.a, 1)
	r2 := nextResponse(t, c.resps)
	f.hasPair(t, r2.GetResources(), 1, f.a)
	c.send([]string{f.a}, r2.GetVersionInfo(), r2.GetNonce(), nil)
	noResponse(t, c.resps, "after the ACK that follows a NACK")
	if got := f.s.sds.rejects.Load(); got != 1 {
		t.Errorf("rejects = %d, want 1", got)
	}
}

// TestSotWTwoStreamsOneName: a change reaches every stream watching the name.
func TestSotWTwoStreamsOneName(t *testing.T) {
	f := newXDSFixture(t)
	cs := []*sotwClient{openSotW(t, f.conn), openSotW(t, f.conn)}
	for _, c := range cs {
		c.send([]string{f.a}, "", "", nil)
		r := nextResponse(t, c.resps)
		f.hasPair(t, r.GetResources(), 0, f.a)
		c.send([]string{f.a}, r.GetVersionInfo(), r.GetNonce(), nil)
	}
	f.change(f.a, 1)
	for i, c := range cs {
		if r := nextResponse(t, c.resps); len(r.GetResources()) != 1 {
			t.Errorf("stream %d: %d secrets, want the changed one", i, len(r.GetResources()))
		} else {
			f.hasPair(t, r.GetResources(), 1, f.a)
		}
	}
}

// TestSotWOtherServerVersion: a client that kept a version from an earlier sds-server gets
// its secrets on a new stream, and an answer even when it names none.
func TestSotWOtherServerVersion(t *testing.T) {
	f := newXDSFixture(t)
	c := openSotW(t, f.conn)
	c.send([]string{f.a}, "2000-01-01T00:00:00Z/7", "", nil)
	f.hasPair(t, nextResponse(t, c.resps).GetResources(), 0, f.a)
	e := openSotW(t, f.conn)
	e.send(nil, "2000-01-01T00:00:00Z/7", "", nil)
	if r := nextResponse(t, e.resps); len(r.GetResources()) != 0 {
		t.Errorf("a request without names got %d secrets", len(r.GetResources()))
	}
}

// deltaClient is an incremental stream whose requests the test writes one by one.
type deltaClient struct {
	t      *testing.T
	st     secretv3.SecretDiscoveryService_DeltaSecretsClient
	resps  <-chan *discoveryv3.DeltaDiscoveryResponse
	cancel context.CancelFunc
}

func openDelta(t *testing.T, conn *grpc.ClientConn) *deltaClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := secretv3.NewSecretDiscoveryServiceClient(conn).DeltaSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &deltaClient{t: t, st: st, resps: receive(ctx, st.Recv), cancel: cancel}
}

func (d *deltaClient) send(req *discoveryv3.DeltaDiscoveryRequest) {
	d.t.Helper()
	req.TypeUrl = resourcev3.SecretType
	if err := d.st.Send(req); err != nil {
		d.t.Fatalf("send delta SDS request: %v", err)
	}
}

func (d *deltaClient) ack(r *discoveryv3.DeltaDiscoveryResponse) {
	d.t.Helper()
	d.send(&discoveryv3.DeltaDiscoveryRequest{ResponseNonce: r.GetNonce()})
}

func anys(rs []*discoveryv3.Resource) []*anypb.Any {
	out := make([]*anypb.Any, len(rs))
	for i, r := range rs {
		out[i] = r.GetResource()
	}
	return out
}

// TestDeltaSubscriptions: a request without names gets nothing; subscribing gets the named
// secret with its resource version; an unsubscribed name is no longer pushed; a NACK is
// counted and keeps the stream serving; a new stream's initial versions are not sent again.
func TestDeltaSubscriptions(t *testing.T) {
	f := newXDSFixture(t)
	d := openDelta(t, f.conn)
	d.send(&discoveryv3.DeltaDiscoveryRequest{})
	noResponse(t, d.resps, "a delta request without names")

	d.send(&discoveryv3.DeltaDiscoveryRequest{ResourceNamesSubscribe: []string{f.a}})
	r1 := nextResponse(t, d.resps)
	f.hasPair(t, anys(r1.GetResources()), 0, f.a)
	if r1.GetResources()[0].GetVersion() == "" || r1.GetResources()[0].GetName() != f.a ||
		!strings.HasPrefix(r1.GetSystemVersionInfo(), f.s.secrets.prefix) || r1.GetNonce() == "" {
		t.Errorf("delta response: resource %q version %q, system version %q, nonce %q", r1.GetResources()[0].GetName(),
			r1.GetResources()[0].GetVersion(), r1.GetSystemVersionInfo(), r1.GetNonce())
	}
	d.ack(r1)
	noResponse(t, d.resps, "after a delta ACK")

	d.send(&discoveryv3.DeltaDiscoveryRequest{ResourceNamesSubscribe: []string{f.b}})
	r2 := nextResponse(t, d.resps)
	f.hasPair(t, anys(r2.GetResources()), 0, f.b)
	d.ack(r2)

	d.send(&discoveryv3.DeltaDiscoveryRequest{ResourceNamesUnsubscribe: []string{f.a}})
	noResponse(t, d.resps, "after an unsubscribe")
	f.change(f.a, 1)
	noResponse(t, d.resps, "a change of an unsubscribed secret")
	f.change(f.b, 1)
	r3 := nextResponse(t, d.resps)
	f.hasPair(t, anys(r3.GetResources()), 1, f.b)

	d.send(&discoveryv3.DeltaDiscoveryRequest{ResponseNonce: r3.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "bad secret"}})
	eventually(t, "the delta NACK to be counted", func() bool { return f.s.sds.rejects.Load() == 1 })
	noResponse(t, d.resps, "after a delta NACK")

	d.send(&discoveryv3.DeltaDiscoveryRequest{ResourceNamesSubscribe: []string{f.a}})
	f.hasPair(t, anys(nextResponse(t, d.resps).GetResources()), 1, f.a) // subscribed again: sent again

	// A reconnecting client that holds b's version gets b when it changes, not before.
	e := openDelta(t, f.conn)
	e.send(&discoveryv3.DeltaDiscoveryRequest{ResourceNamesSubscribe: []string{f.b},
		InitialResourceVersions: map[string]string{f.b: r3.GetResources()[0].GetVersion()}})
	noResponse(t, e.resps, "a secret the client holds")
	f.change(f.b, 0)
	f.hasPair(t, anys(nextResponse(t, e.resps).GetResources()), 0, f.b)
}

// TestStreamEndReleasesWatches: a stream that ends, SotW or delta, no longer watches its
// names (and its goroutines end: TestMain's goleak).
func TestStreamEndReleasesWatches(t *testing.T) {
	f := newXDSFixture(t)
	c := openSotW(t, f.conn)
	c.send([]string{f.a, f.b}, "", "", nil)
	nextResponse(t, c.resps)
	d := openDelta(t, f.conn)
	d.send(&discoveryv3.DeltaDiscoveryRequest{ResourceNamesSubscribe: []string{f.a}})
	nextResponse(t, d.resps)
	if got := f.s.secrets.watching(f.a); got != 2 {
		t.Fatalf("%d streams watch a, want 2", got)
	}
	c.cancel()
	d.cancel()
	eventually(t, "the ended streams to release their watches", func() bool {
		return f.s.secrets.watching(f.a) == 0 && f.s.secrets.watching(f.b) == 0
	})
}

// TestWrongType: a request for another resource type ends the stream with InvalidArgument.
func TestWrongType(t *testing.T) {
	f := newXDSFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := secretv3.NewSecretDiscoveryServiceClient(f.conn).StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNames: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a cluster request: %v, want InvalidArgument", err)
	}
}
