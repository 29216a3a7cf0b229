package xdsproxy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// rawStream is a client stream of the proxy that sends and receives exact bytes.
type rawStream struct {
	grpc.ClientStream
	f *flavour
}

func openRaw(t testing.TB, target string, f *flavour) *rawStream {
	t.Helper()
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, f.method)
	if err != nil {
		t.Fatal(err)
	}
	return &rawStream{s, f}
}

// send sends b; io.EOF means the proxy already ended the stream, which recv then reports.
func (s *rawStream) send(t testing.TB, b []byte) {
	t.Helper()
	if err := s.SendMsg(&frame{data: b}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
}

func (s *rawStream) recv() (*frame, error) {
	f := &frame{typeURLField: s.f.responseTypeURL()}
	return f, s.RecvMsg(f)
}

func field(m proto.Message, name string) protowire.Number {
	return m.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(name)).Number()
}

// request encodes a request of flavour f for typeURL, with its node.
func encodeRequest(t testing.TB, f *flavour, typeURL string) []byte {
	t.Helper()
	m := f.request(typeURL, nil)
	b := protowire.AppendTag(mustMarshal(t, m), field(m, "node"), protowire.BytesType)
	return protowire.AppendBytes(b, mustMarshal(t, testNode("node-raw", "envoy")))
}

// response encodes a response of flavour f: typeURL, nonce and one resource.
func encodeResponse(t testing.TB, f *flavour, typeURL, nonce string, resource *anypb.Any) []byte {
	t.Helper()
	if f == sotw {
		return mustMarshal(t, &discoveryv3.DiscoveryResponse{TypeUrl: typeURL, Nonce: nonce, VersionInfo: "v1", Resources: []*anypb.Any{resource}})
	}
	return mustMarshal(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, Nonce: nonce, SystemVersionInfo: "v1",
		Resources: []*discoveryv3.Resource{{Name: "r", Version: "1", Resource: resource}}})
}

// TestBytesUnchanged: requests reach the control plane and responses reach the client as the
// exact bytes that were sent, even in an unusual field order and with unknown fields.
func TestBytesUnchanged(t *testing.T) {
	for _, f := range []*flavour{sotw, delta} {
		t.Run(f.name, func(t *testing.T) {
			up := startFakeUpstream(t)
			tp := startProxy(t, Config{Upstream: Upstream{Address: up.addr}})
			s := openRaw(t, tp.uri(), f)

			// Unknown field 999 first, then the type URL, then the node: not Go's order.
			req := protowire.AppendVarint(protowire.AppendTag(nil, 999, protowire.VarintType), 7)
			req = protowire.AppendString(protowire.AppendTag(req, f.requestTypeURL(), protowire.BytesType), ListenerType)
			req = protowire.AppendBytes(protowire.AppendTag(req, field(f.request("", nil), "node"), protowire.BytesType),
				mustMarshal(t, testNode("node-raw", "envoy")))
			s.send(t, req)
			if got := up.nextRequest(t, ListenerType); !bytes.Equal(got.data, req) {
				t.Errorf("upstream received\n%x\nwant\n%x", got.data, req)
			}

			listener, err := anypb.New(&listenerv3.Listener{Name: "l"})
			if err != nil {
				t.Fatal(err)
			}
			resp := protowire.AppendString(protowire.AppendTag(nil, 5, protowire.BytesType), "nonce-1") // nonce first
			resp = protowire.AppendVarint(protowire.AppendTag(resp, 999, protowire.VarintType), 9)
			resp = append(resp, encodeResponse(t, f, ListenerType, "", listener)...)
			up.send <- resp
			got, err := s.recv()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.data, resp) {
				t.Errorf("client received\n%x\nwant\n%x", got.data, resp)
			}
		})
	}
}

// TestMalformedUpstream: a name table that does not decode is NACKed upstream; a type that is
// not Envoy's is dropped; a message that is not xDS at all ends the stream, logged, and the
// proxy serves the next stream.
func TestMalformedUpstream(t *testing.T) {
	for _, f := range []*flavour{sotw, delta} {
		t.Run(f.name, func(t *testing.T) {
			up := startFakeUpstream(t)
			tp := startProxy(t, Config{Upstream: Upstream{Address: up.addr}, NameTable: true})
			s := openRaw(t, tp.uri(), f)
			s.send(t, encodeRequest(t, f, ListenerType))
			<-up.opened
			up.nextRequest(t, agentv1.TypeNameTable)

			up.send <- encodeResponse(t, f, agentv1.TypeNameTable, "nds-1", &anypb.Any{TypeUrl: agentv1.TypeNameTable, Value: []byte{0xff, 0xff, 0xff}})
			nack := f.request("", nil)
			if err := proto.Unmarshal(up.nextRequest(t, agentv1.TypeNameTable).data, nack); err != nil {
				t.Fatal(err)
			}
			nonce, detail := nonceAndDetail(nack)
			if nonce != "nds-1" || detail.GetCode() != 13 || !strings.Contains(detail.GetMessage(), "decode name table") {
				t.Errorf("NACK nonce %q, detail %v; want nds-1 with code 13", nonce, detail)
			}
			if tp.bus.broker.Retained("name-table") != nil {
				t.Error("a name table that does not decode was published")
			}

			up.send <- encodeResponse(t, f, "type.googleapis.com/example.Unknown", "x-1", &anypb.Any{TypeUrl: "type.googleapis.com/example.Unknown"})
			listener, _ := anypb.New(&listenerv3.Listener{Name: "l"})
			up.send <- encodeResponse(t, f, ListenerType, "lds-1", listener)
			got, err := s.recv()
			if err != nil {
				t.Fatal(err)
			}
			if got.typeURL != ListenerType {
				t.Errorf("client received %s first, want the listener (the unknown type dropped)", got.typeURL)
			}

			up.send <- []byte{0xff, 0xff, 0xff}
			if _, err := s.recv(); err == nil {
				t.Fatal("the stream survived a message that is not xDS")
			}
			s = openRaw(t, tp.uri(), f)
			s.send(t, encodeRequest(t, f, ListenerType))
			<-up.opened
			up.nextRequest(t, ListenerType)
			if n := tp.counter(t, "istio_agent_istiod_connection_terminations", "type", "error"); n != 1 {
				t.Errorf("upstream error terminations = %v, want 1", n)
			}
		})
	}
}

func nonceAndDetail(m proto.Message) (string, *status.Status) {
	switch r := m.(type) {
	case *discoveryv3.DiscoveryRequest:
		return r.ResponseNonce, r.ErrorDetail
	case *discoveryv3.DeltaDiscoveryRequest:
		return r.ResponseNonce, r.ErrorDetail
	}
	return "", nil
}

// TestUpstreamTLS: the server name follows Istio's rules; a valid client certificate is
// presented, an expired one is not.
func TestUpstreamTLS(t *testing.T) {
	dir := tempDir(t)
	ca := newCA(t)
	root := filepath.Join(dir, "root-cert.pem")
	writePEM(t, root, ca.cert.Raw)
	serverCert := ca.issue(t, "istiod.istio-system.svc", time.Hour)
	up := startFakeUpstream(t, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serverCert}, ClientAuth: tls.RequestClientCert,
	})))
	_, port, _ := strings.Cut(up.addr, ":")
	valid, expired := writeKeyPair(t, dir, "valid", ca.issue(t, "client", time.Hour)), writeKeyPair(t, dir, "expired", ca.issue(t, "client", -time.Hour))

	for _, tc := range []struct {
		name        string
		upstream    Upstream
		ok          bool
		clientCerts int
	}{
		{"ip without SAN", Upstream{Address: "127.0.0.1:" + port}, false, 0},
		{"localhost is istiod", Upstream{Address: "localhost:" + port}, true, 0},
		{"ISTIOD_SAN", Upstream{Address: "127.0.0.1:" + port, SAN: "istiod.istio-system.svc"}, true, 0},
		{"wrong SAN", Upstream{Address: "127.0.0.1:" + port, SAN: "other.svc"}, false, 0},
		{"client certificate", Upstream{Address: "localhost:" + port, CertChain: valid[0], Key: valid[1]}, true, 1},
		{"expired client certificate", Upstream{Address: "localhost:" + port, CertChain: expired[0], Key: expired[1]}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.upstream.TLS, tc.upstream.RootCert = true, root
			tp := startProxy(t, Config{Upstream: tc.upstream})
			s := openRaw(t, tp.uri(), sotw)
			s.send(t, encodeRequest(t, sotw, ListenerType))
			if !tc.ok {
				if _, err := s.recv(); err == nil || !strings.Contains(err.Error(), "certificate") {
					t.Fatalf("recv = %v, want a certificate error", err)
				}
				return
			}
			if o := <-up.opened; o.clientCerts != tc.clientCerts {
				t.Errorf("client certificates presented = %d, want %d", o.clientCerts, tc.clientCerts)
			}
			up.nextRequest(t, ListenerType)
		})
	}

	// A root that is missing at the start is read when it appears.
	late := filepath.Join(dir, "late-root.pem")
	tp := startProxy(t, Config{Upstream: Upstream{Address: "localhost:" + port, TLS: true, RootCert: late}})
	s := openRaw(t, tp.uri(), sotw)
	s.send(t, encodeRequest(t, sotw, ListenerType))
	if _, err := s.recv(); err == nil || !strings.Contains(err.Error(), "root") {
		t.Fatalf("recv without the root = %v, want an error naming the root", err)
	}
	writePEM(t, late, ca.cert.Raw)
	s = openRaw(t, tp.uri(), sotw)
	s.send(t, encodeRequest(t, sotw, ListenerType))
	<-up.opened
	up.nextRequest(t, ListenerType)
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test root"},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert, key}
}

// issue signs a certificate for name valid until now+validity (negative: already expired).
func (ca *testCA) issue(t testing.TB, name string, validity time.Duration) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(validity),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(t testing.TB, path string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeKeyPair writes c as <name>-cert.pem and <name>-key.pem and returns their paths.
func writeKeyPair(t testing.TB, dir, name string, c tls.Certificate) [2]string {
	t.Helper()
	certPath, keyPath := filepath.Join(dir, name+"-cert.pem"), filepath.Join(dir, name+"-key.pem")
	writePEM(t, certPath, c.Certificate[0])
	der, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return [2]string{certPath, keyPath}
}

// TestProxyConfigConsumed: with PCDS on, the proxy asks for it after the client's first LDS
// request, publishes its CA certificates as the trust bundle, ACKs it, and ignores an empty
// response (no ACK), as Istio does.
func TestProxyConfigConsumed(t *testing.T) {
	for _, f := range []*flavour{sotw, delta} {
		t.Run(f.name, func(t *testing.T) {
			up := startFakeUpstream(t)
			tp := startProxy(t, Config{Upstream: Upstream{Address: up.addr}, ProxyConfig: true})
			s := openRaw(t, tp.uri(), f)
			s.send(t, encodeRequest(t, f, ListenerType))
			<-up.opened
			up.nextRequest(t, agentv1.TypeProxyConfig)

			if f == sotw {
				up.send <- mustMarshal(t, &discoveryv3.DiscoveryResponse{TypeUrl: agentv1.TypeProxyConfig, Nonce: "pc-0"})
			} else {
				up.send <- mustMarshal(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: agentv1.TypeProxyConfig, Nonce: "pc-0"})
			}
			pc, err := anypb.New(&meshv1alpha1.ProxyConfig{CaCertificatesPem: []string{"root-1", "root-2"}})
			if err != nil {
				t.Fatal(err)
			}
			up.send <- encodeResponse(t, f, agentv1.TypeProxyConfig, "pc-1", pc)
			ack := f.request("", nil)
			if err := proto.Unmarshal(up.nextRequest(t, agentv1.TypeProxyConfig).data, ack); err != nil {
				t.Fatal(err)
			}
			if nonce, detail := nonceAndDetail(ack); nonce != "pc-1" || detail != nil {
				t.Errorf("first PCDS request after the responses: nonce %q, detail %v; want the ACK of pc-1 (none for the empty pc-0)", nonce, detail)
			}
			var tb agentv1.TrustBundle
			tp.bus.waitRetained(t, agentv1.TopicTrustBundle, &tb)
			if got := tb.GetCaCertificatesPem(); len(got) != 2 || got[0] != "root-1" || got[1] != "root-2" {
				t.Errorf("trust bundle = %v, want [root-1 root-2]", got)
			}
		})
	}
}

// TestEitherEndEndsBoth: a client that goes away ends its upstream stream; an upstream
// stream that fails ends the client's stream with the upstream's status.
func TestEitherEndEndsBoth(t *testing.T) {
	up := startFakeUpstream(t)
	tp := startProxy(t, Config{Upstream: Upstream{Address: up.addr}})
	s := openRaw(t, tp.uri(), sotw)
	s.send(t, encodeRequest(t, sotw, ListenerType))
	<-up.opened
	up.nextRequest(t, ListenerType)
	s.CloseSend()
	select {
	case <-up.ended:
	case <-time.After(15 * time.Second):
		t.Fatal("the upstream stream outlived its client")
	}
	waitFor(t, "a counted client end", func() bool {
		return tp.counter(t, "istio_agent_envoy_connection_terminations", "type", "cancelled") == 1
	})

	s = openRaw(t, tp.uri(), sotw)
	s.send(t, encodeRequest(t, sotw, ListenerType))
	<-up.opened
	up.nextRequest(t, ListenerType)
	up.kill <- struct{}{}
	if _, err := s.recv(); err == nil || !strings.Contains(err.Error(), "stream killed by the test") {
		t.Errorf("client's recv after the upstream failed = %v, want the upstream's status", err)
	}
}
