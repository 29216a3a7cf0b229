package caclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"encoding/asn1"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/agentd/agentd/internal/testing/ca"
)

// referenceCases is where the outputs recorded from Istio's pilot-agent are
// (../shared/reference/istio from the project's root).
const referenceCases = "../../../shared/reference/istio/cases"

// TestCSRAsIstio: the CA call agentd makes for the reference cases' workload is the one
// pilot-agent made, decoded the same way as each case's csr.json: subject, SANs and their
// criticality, key, signature algorithm, TTL, request metadata and gRPC headers. The CA is
// plaintext on port 15010, with no root file anywhere, as in the recordings.
func TestCSRAsIstio(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(referenceCases, "*", "csr.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no csr.json under %s (%v): the reference data is missing", referenceCases, err)
	}
	rec, addr := startPlaintextCA(t)
	token := filepath.Join(t.TempDir(), "istio-token")
	if err := os.WriteFile(token, []byte("not-a-jwt"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The base environment of every case: ISTIO_META_CLUSTER_ID=Kubernetes, TRUST_DOMAIN,
	// POD_NAMESPACE and SERVICE_ACCOUNT as below, no ISTIO_META_CERT_SIGNER, Istio's key
	// defaults (RSA 2048, PKCS#1) and SECRET_TTL 24h.
	c, err := New(Options{Address: addr, TokenFile: token, ClusterID: "Kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	csr, _, key, err := NewCSR(KeyOptions{}, SPIFFEID("cluster.local", "default", "default"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	chain, err := c.Sign(ctx, csr, 24*time.Hour)
	if err != nil {
		t.Fatalf("Sign over plaintext to %s: %v", addr, err)
	}
	if _, err := Verify(chain, key.Public(), time.Now()); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	md, req, _ := rec.last()
	got := []any{decodeCall(t, req, md)}
	for _, f := range files {
		t.Run(filepath.Base(filepath.Dir(f)), func(t *testing.T) {
			want := readJSON(t, f)
			// The one value of the recording tied to its run: the CA address it dialled.
			for _, call := range want.([]any) {
				call.(map[string]any)["grpc_metadata"].(map[string]any)[":authority"] = []any{addr}
			}
			if d := cmp.Diff(want, normalize(t, got)); d != "" {
				t.Errorf("agentd's CA call differs from pilot-agent's (-pilot-agent +agentd):\n%s", d)
			}
		})
	}
}

// startPlaintextCA serves rec without TLS on port 15010 of a random loopback address (the
// port that makes a client skip TLS; the address keeps it apart from anything else here).
func startPlaintextCA(t testing.TB) (*recordingCA, string) {
	t.Helper()
	c, err := ca.New(ca.Options{TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingCA{ca: c}
	var l net.Listener
	for range 20 {
		addr := fmt.Sprintf("127.%d.%d.%d:15010", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1)
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("listen on a loopback :15010: %v", err)
	}
	s := grpc.NewServer()
	securityv1alpha1.RegisterIstioCertificateServiceServer(s, rec)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return rec, l.Addr().String()
}

// decodeCall decodes a CA call as the reference's csr.json does.
func decodeCall(t *testing.T, req *securityv1alpha1.IstioCertificateRequest, md map[string][]string) map[string]any {
	t.Helper()
	reqMD := map[string]any{}
	for k, v := range req.GetMetadata().GetFields() {
		reqMD[k] = v.AsInterface()
	}
	return map[string]any{
		"csr":               decodeCSR(t, []byte(req.GetCsr())),
		"grpc_metadata":     md,
		"request_metadata":  reqMD,
		"validity_duration": req.GetValidityDuration(),
	}
}

// extensionNames are the names csr.json gives extension OIDs.
var extensionNames = map[string]string{
	"2.5.29.17": "subjectAltName", "2.5.29.15": "keyUsage", "2.5.29.37": "extKeyUsage",
	"2.5.29.19": "basicConstraints",
}

func decodeCSR(t *testing.T, csrPEM []byte) map[string]any {
	t.Helper()
	blk, rest := pem.Decode(csrPEM)
	if blk == nil {
		t.Fatalf("CSR is not PEM: %q", csrPEM)
	}
	blocks := 1
	for b, r := pem.Decode(rest); b != nil; b, r = pem.Decode(r) {
		blocks++
	}
	csr, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		t.Fatalf("parse CSR: %v", err)
	}
	var exts []any
	for _, e := range csr.Extensions {
		exts = append(exts, map[string]any{"oid": e.Id.String(), "critical": e.Critical, "name": extensionNames[e.Id.String()]})
	}
	out := map[string]any{
		"attribute_oids":       attributeOIDs(t, csr.RawTBSCertificateRequest),
		"dns_names":            strs(csr.DNSNames),
		"emails":               strs(csr.EmailAddresses),
		"extensions":           exts,
		"ips":                  strs(csr.IPAddresses),
		"pem_blocks":           blocks,
		"pem_type":             blk.Type,
		"public_key_algorithm": csr.PublicKeyAlgorithm.String(),
		"signature_algorithm":  csr.SignatureAlgorithm.String(),
		"signature_valid":      csr.CheckSignature() == nil,
		"subject":              csr.Subject.String(),
		"subject_empty":        len(csr.Subject.Names) == 0,
		"uris":                 strs(csr.URIs),
		"version":              csr.Version,
	}
	switch k := csr.PublicKey.(type) {
	case *rsa.PublicKey:
		out["key_size"], out["rsa_exponent"] = k.N.BitLen(), k.E
	case *ecdsa.PublicKey:
		out["key_size"], out["curve"] = k.Curve.Params().BitSize, k.Curve.Params().Name
	}
	return out
}

// attributeOIDs are the types of the CSR's attributes (PKCS #10: [0] IMPLICIT SET OF
// Attribute), which crypto/x509 exposes only through a deprecated field.
func attributeOIDs(t *testing.T, tbs []byte) []string {
	t.Helper()
	var info struct {
		Version    int
		Subject    asn1.RawValue
		PublicKey  asn1.RawValue
		Attributes []struct {
			Type   asn1.ObjectIdentifier
			Values asn1.RawValue
		} `asn1:"tag:0,set"`
	}
	if _, err := asn1.Unmarshal(tbs, &info); err != nil {
		t.Fatalf("decode CSR info: %v", err)
	}
	oids := []string{}
	for _, a := range info.Attributes {
		oids = append(oids, a.Type.String())
	}
	return oids
}

var grpcGoVersion = regexp.MustCompile(`grpc-go/[0-9][0-9A-Za-z.+-]*`)

// normalize turns v into plain JSON data, with grpc-go's version replaced as the reference
// does.
func normalize(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	b = grpcGoVersion.ReplaceAll(b, []byte("grpc-go/<v>"))
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func readJSON(t *testing.T, path string) any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// strs is the string form of each of vs, [] for none.
func strs[T any](vs []T) []string {
	out := []string{}
	for _, v := range vs {
		out = append(out, fmt.Sprint(v))
	}
	return out
}
