// Package wasmtest serves Wasm modules to tests over real protocols: an in-process OCI
// registry (go-containerregistry's, the distribution API) holding a module in each image
// layout Istio reads, and an HTTP server.
package wasmtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Module is a valid Wasm binary: the header and a custom section naming it.
func Module(label string) []byte {
	b := []byte("\x00asm\x01\x00\x00\x00")
	section := append([]byte{byte(len(label))}, label...)
	return append(append(b, 0, byte(len(section))), section...)
}

// SHA256 is the hex sha256 of b.
func SHA256(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Image layouts Istio reads.
const (
	// Artifact is the "oci" variant: a raw module layer of the Wasm media type.
	Artifact = "artifact"
	// Compat is a plain OCI image whose layer is a tar.gz holding plugin.wasm.
	Compat = "compat"
	// Docker is the compat variant with Docker's manifest and layer types.
	Docker = "docker"
)

// Server is a registry and an HTTP server holding one module.
type Server struct {
	Module []byte
	// Registry is the registry's host:port; Images maps each layout to its image's
	// reference (host:port/wasm/<layout>:v1) and Digests to its manifest digest (hex).
	Registry        string
	Images, Digests map[string]string
	// HTTP is the base URL of the HTTP server: /plugin.wasm, /plugin.wasm.gz, /plugin.tar.gz,
	// /slow (answers after the request ends), /big (more bytes than a module should have).
	HTTP string
	// Requests counts the requests both servers answered.
	Requests atomic.Int64
}

// Start serves module until the test ends.
func Start(t testing.TB, module []byte) *Server {
	t.Helper()
	return start(t, module, nil)
}

// StartPrivate is Start with a registry that answers only requests with HTTP Basic
// credentials user:password, as a private registry does; the HTTP server stays open.
func StartPrivate(t testing.TB, module []byte, user, password string) *Server {
	t.Helper()
	return start(t, module, &authn.Basic{Username: user, Password: password})
}

func start(t testing.TB, module []byte, auth *authn.Basic) *Server {
	s := &Server{Module: module, Images: map[string]string{}, Digests: map[string]string{}}
	var regHandler http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var push authn.Authenticator = authn.Anonymous
	if auth != nil {
		regHandler, push = requireBasic(regHandler, auth), auth
	}
	reg := httptest.NewServer(s.count(regHandler))
	t.Cleanup(reg.Close)
	s.Registry = strings.TrimPrefix(reg.URL, "http://")
	for layout, img := range map[string]v1.Image{Artifact: artifact(t, module), Compat: compat(t, module, types.OCILayer), Docker: compat(t, module, types.DockerLayer)} {
		ref := s.Registry + "/wasm/" + layout + ":v1"
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(r, img, remote.WithAuth(push)); err != nil {
			t.Fatalf("pushing %s: %v", ref, err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		s.Images[layout], s.Digests[layout] = ref, d.Hex
	}
	mux := http.NewServeMux()
	serve := func(b []byte) http.HandlerFunc { return func(w http.ResponseWriter, _ *http.Request) { w.Write(b) } }
	mux.Handle("/plugin.wasm", serve(module))
	mux.Handle("/plugin.wasm.gz", serve(gz(t, module)))
	mux.Handle("/plugin.tar.gz", serve(gz(t, tarOf(t, "plugin.wasm", module))))
	mux.Handle("/big", serve(append(append([]byte{}, module...), make([]byte, 1<<20)...)))
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	h := httptest.NewServer(s.count(mux))
	t.Cleanup(h.Close)
	s.HTTP = h.URL
	return s
}

// requireBasic answers 401 to a request without the credentials, with the distribution API's
// error. The challenge names no realm: Istio refuses a realm that is not an http(s) URL of a
// public host, even a Basic one, and a test registry's URL is a loopback one.
func requireBasic(h http.Handler, auth *authn.Basic) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != auth.Username || p != auth.Password {
			w.Header().Set("WWW-Authenticate", `Basic charset="UTF-8"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Server) count(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Requests.Add(1)
		h.ServeHTTP(w, r)
	})
}

func artifact(t testing.TB, module []byte) v1.Image {
	img, err := mutate.Append(empty.Image,
		mutate.Addendum{Layer: static.NewLayer(module, "application/vnd.module.wasm.content.layer.v1+wasm")},
		mutate.Addendum{Layer: static.NewLayer([]byte("{}"), "application/vnd.module.wasm.config.v1+json")})
	if err != nil {
		t.Fatal(err)
	}
	return mutate.MediaType(img, types.OCIManifestSchema1)
}

func compat(t testing.TB, module []byte, layerType types.MediaType) v1.Image {
	img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: static.NewLayer(gz(t, tarOf(t, "plugin.wasm", module)), layerType)})
	if err != nil {
		t.Fatal(err)
	}
	if layerType == types.OCILayer {
		return mutate.MediaType(img, types.OCIManifestSchema1)
	}
	return img // empty.Image's manifest is Docker's
}

func tarOf(t testing.TB, file string, b []byte) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: file, Mode: 0o644, Size: int64(len(b))}); err != nil {
		t.Fatal(err)
	}
	tw.Write(b)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gz(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
