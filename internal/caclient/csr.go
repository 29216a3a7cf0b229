package caclient

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
)

// KeyOptions says what kind of private key to make for a CSR, as Istio's agent does.
type KeyOptions struct {
	// RSAKeySize is the RSA modulus size (WORKLOAD_RSA_KEY_SIZE); default and minimum 2048.
	RSAKeySize int
	// ECCSignatureAlgorithm "ECDSA" (ECC_SIGNATURE_ALGORITHM) makes an ECDSA key instead of RSA.
	ECCSignatureAlgorithm string
	// ECCCurve is "P256" (default) or "P384" (ECC_CURVE).
	ECCCurve string
	// PKCS8 encodes the key as PKCS#8 instead of PKCS#1 / SEC 1 (PKCS8_KEY).
	PKCS8 bool
}

// SPIFFEID is Istio's workload identity: spiffe://<trust domain>/ns/<namespace>/sa/<service account>.
func SPIFFEID(trustDomain, namespace, serviceAccount string) string {
	return fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", trustDomain, namespace, serviceAccount)
}

// NewCSR makes a private key as o asks and a PEM CSR for it whose only subject alternative
// name is the URI id. It returns the CSR, the key in PEM and the key itself.
//
// The CSR is Istio's agent's: subject "O=" (one empty organization) and the SAN extension
// marked critical, as RFC 5280 wants when the subject carries no name. CAs that check what
// they sign (Istio's, cert-manager's istio-csr, plugged-in ones) see the same request from
// agentd as from pilot-agent.
func NewCSR(o KeyOptions, id string) (csrPEM, keyPEM []byte, key crypto.Signer, err error) {
	if _, err := url.Parse(id); err != nil {
		return nil, nil, nil, fmt.Errorf("parse identity %q: %w", id, err)
	}
	san, err := uriSAN(id)
	if err != nil {
		return nil, nil, nil, err
	}
	key, err = newKey(o)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{""}}, ExtraExtensions: []pkix.Extension{san}}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create CSR for %s: %w", id, err)
	}
	keyPEM, err = encodeKey(key, o.PKCS8)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), keyPEM, key, nil
}

// oidSubjectAltName is the subjectAltName extension (RFC 5280, 4.2.1.6).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// uriSAN is a critical subjectAltName extension holding uri, as given, as its one
// uniformResourceIdentifier ([6] IA5String).
func uriSAN(uri string) (pkix.Extension, error) {
	v, err := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(uri)}})
	if err != nil {
		return pkix.Extension{}, fmt.Errorf("encode SAN %s: %w", uri, err)
	}
	return pkix.Extension{Id: oidSubjectAltName, Critical: true, Value: v}, nil
}

// Validate reports an unsupported algorithm or curve.
func (o KeyOptions) Validate() error {
	_, err := o.curve()
	return err
}

// curve is the ECDSA curve asked for, or nil for RSA.
func (o KeyOptions) curve() (elliptic.Curve, error) {
	switch {
	case o.ECCSignatureAlgorithm == "":
		return nil, nil
	case !strings.EqualFold(o.ECCSignatureAlgorithm, "ECDSA"):
		return nil, fmt.Errorf("unsupported ECC signature algorithm %q (want ECDSA)", o.ECCSignatureAlgorithm)
	}
	switch strings.ToUpper(o.ECCCurve) {
	case "", "P256":
		return elliptic.P256(), nil
	case "P384":
		return elliptic.P384(), nil
	}
	return nil, fmt.Errorf("unsupported ECC curve %q (want P256 or P384)", o.ECCCurve)
}

func newKey(o KeyOptions) (crypto.Signer, error) {
	curve, err := o.curve()
	if err != nil {
		return nil, err
	}
	if curve != nil {
		k, err := ecdsa.GenerateKey(curve, rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generate ECDSA key: %w", err)
		}
		return k, nil
	}
	bits := max(o.RSAKeySize, 2048)
	var k *rsa.PrivateKey
	withSpareP(func() { k, err = rsa.GenerateKey(rand.Reader, bits) })
	if err != nil {
		return nil, fmt.Errorf("generate RSA %d key: %w", bits, err)
	}
	return k, nil
}

// spare counts the key generations running (withSpareP), and whether they raised GOMAXPROCS.
var spare struct {
	sync.Mutex
	n      int
	raised bool
}

// withSpareP runs fn, an RSA key's generation (50-150 ms of CPU), with one more P than the
// process has when it has one (agentd's helpers run with GOMAXPROCS=1): on one P it holds up
// every other goroutine of sds-server for its duration, agentd's readiness calls and Envoy's
// SDS stream among them, which wait for the scheduler's 10 ms preemptions (readiness answered
// 70-90 ms late in scripts/bench/peer.sh's starts). The P goes away afterwards, and with it
// its memory.
func withSpareP(fn func()) {
	spare.Lock()
	if spare.n++; spare.n == 1 && runtime.GOMAXPROCS(0) == 1 {
		runtime.GOMAXPROCS(2)
		spare.raised = true
	}
	spare.Unlock()
	defer func() {
		spare.Lock()
		if spare.n--; spare.n == 0 && spare.raised {
			runtime.GOMAXPROCS(1)
			spare.raised = false
		}
		spare.Unlock()
	}()
	fn()
}

func encodeKey(key crypto.Signer, pkcs8 bool) ([]byte, error) {
	if pkcs8 {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, fmt.Errorf("encode PKCS#8 key: %w", err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
	}
	switch k := key.(type) {
	case *rsa.PrivateKey:
		return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), nil
	case *ecdsa.PrivateKey:
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, fmt.Errorf("encode EC key: %w", err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
	}
	return nil, fmt.Errorf("unsupported key type %T", key)
}
