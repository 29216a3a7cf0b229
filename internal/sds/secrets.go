package sds

import (
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/agentd/agentd/internal/caclient"
)

// Istio's SDS resource names.
const (
	ResourceDefault = "default"          // the workload certificate chain and key
	ResourceRootCA  = "ROOTCA"           // the workload trust roots
	fileCertPrefix  = "file-cert:"       // file-cert:<cert path>~<key path>
	fileRootPrefix  = "file-root:"       // file-root:<CA path>
	ResourceSystem  = "file-root:system" // the OS trust bundle
)

// systemBundles are the OS trust bundles file-root:system is read from: the first that exists.
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/pki/tls/cacert.pem",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"/etc/ssl/cert.pem",
	"/usr/local/etc/ssl/cert.pem",
	"/etc/ssl/certs/ca-certificates",
}

// fileResource is a resource name that refers to files: a cert/key pair or a root bundle.
type fileResource struct {
	cert, key string // a pair
	root      string // a root bundle
}

// parseFileResource parses Istio's file-cert:<cert>~<key> and file-root:<ca> names.
func parseFileResource(name string) (fileResource, bool) {
	if rest, ok := strings.CutPrefix(name, fileCertPrefix); ok {
		cert, key, ok := strings.Cut(rest, "~")
		if !ok || cert == "" || key == "" || strings.Contains(key, "~") {
			return fileResource{}, false
		}
		return fileResource{cert: cert, key: key}, true
	}
	if rest, ok := strings.CutPrefix(name, fileRootPrefix); ok && rest != "" && !strings.Contains(rest, "~") {
		return fileResource{root: rest}, true
	}
	return fileResource{}, false
}

// FileCertResource is the SDS name of a file-mounted pair.
func FileCertResource(cert, key string) string { return fileCertPrefix + cert + "~" + key }

// FileRootResource is the SDS name of a file-mounted root bundle.
func FileRootResource(ca string) string { return fileRootPrefix + ca }

// certSecret is a TlsCertificate secret with inline bytes.
func certSecret(name string, chain, key []byte) *tlsv3.Secret {
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: chain}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: key}},
	}}}
}

// rootSecret is a ValidationContext secret with inline trusted CAs.
func rootSecret(name string, roots []byte) *tlsv3.Secret {
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: roots}},
	}}}
}

// loadPair reads a cert/key pair and fails unless they form a matching pair (a half-written
// or mismatched update is not served).
func loadPair(certPath, keyPath string) (chain, key []byte, err error) {
	if chain, err = os.ReadFile(certPath); err != nil {
		return nil, nil, fmt.Errorf("read certificate: %w", err)
	}
	if key, err = os.ReadFile(keyPath); err != nil {
		return nil, nil, fmt.Errorf("read key: %w", err)
	}
	if _, err := tls.X509KeyPair(chain, key); err != nil {
		return nil, nil, fmt.Errorf("load pair %s, %s: %w", certPath, keyPath, err)
	}
	return chain, key, nil
}

// loadRoots reads a root bundle; invalid certificates are skipped, and it fails only if none
// is valid.
func loadRoots(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read roots: %w", err)
	}
	roots := normalizeRoots(b)
	if len(roots) == 0 {
		return nil, fmt.Errorf("roots %s hold no valid PEM certificate", path)
	}
	return roots, nil
}

// normalizeRoots keeps the valid CERTIFICATE blocks of b, re-encoded one after the other.
func normalizeRoots(b []byte) []byte {
	return joinPEM(splitPEM(b))
}

// splitPEM returns each valid certificate of b as its own PEM text.
func splitPEM(b []byte) []string {
	var out []string
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if _, err := caclient.ParsePEMCerts(pem.EncodeToMemory(blk)); err != nil {
			continue
		}
		out = append(out, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: blk.Bytes})))
	}
}

func joinPEM(certs []string) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		buf.WriteString(c)
	}
	return buf.Bytes()
}

// mergeRoots is Istio's trust-anchor merge: the certificates of every bundle, de-duplicated
// and sorted.
func mergeRoots(bundles ...[]byte) []byte {
	var all []string
	for _, b := range bundles {
		all = append(all, splitPEM(b)...)
	}
	slices.Sort(all)
	return joinPEM(slices.Compact(all))
}

// concatChain joins a CA answer into one PEM chain, each certificate on its own lines.
func concatChain(chain []string) []byte {
	var buf bytes.Buffer
	for _, c := range chain {
		buf.WriteString(c)
		if !strings.HasSuffix(c, "\n") {
			buf.WriteByte('\n')
		}
	}
	return buf.Bytes()
}

// errNoSource is returned for a resource nothing here can serve.
var errNoSource = errors.New("no source for this resource")
