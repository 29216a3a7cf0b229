package wasm

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"

	"github.com/docker/cli/cli/config/configfile"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Media types of the Wasm image layouts Istio reads (solo-io's Wasm image spec): the "oci"
// variant's raw module layer; the "compat" variant is a plain image whose last layer is a
// tar.gz holding plugin.wasm.
const (
	wasmLayerType  = types.MediaType("application/vnd.module.wasm.content.layer.v1+wasm")
	compatFileName = "plugin.wasm"
)

// image is a pulled manifest: its digest (hex) and a way to read the module it carries,
// called only when the digest is not already cached.
type image struct {
	digest string
	module func() ([]byte, error)
}

// pullManifest reads the manifest of ref (host/repo:tag or @digest) from its registry.
func pullManifest(ctx context.Context, ref string, o Options, secret []byte) (*image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("parsing image reference %q: %w", ref, err)
	}
	opts := remoteOptions(ctx, o.insecure(r.Context().RegistryStr()), o, secret)
	desc, err := remote.Get(r, opts...)
	if err != nil && strings.Contains(err.Error(), "server gave HTTP response") {
		// A plain-HTTP registry, reached as Istio reaches it: once more over HTTP.
		if r, err = name.ParseReference(ref, name.Insecure); err == nil {
			desc, err = remote.Get(r, opts...)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("fetching the manifest of %s: %w", ref, err)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, fmt.Errorf("reading image %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("digest of image %s: %w", ref, err)
	}
	return &image{digest: d.Hex, module: func() ([]byte, error) { return extract(img, o.MaxBinarySize) }}, nil
}

func remoteOptions(ctx context.Context, insecure bool, o Options, secret []byte) []remote.Option {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = dialer(o.BlockedCIDRs)
	if insecure {
		t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // WASM_INSECURE_REGISTRIES
	}
	var kc authn.Keychain = authn.DefaultKeychain // DOCKER_CONFIG, as Istio without a secret
	if secret != nil {
		kc = pullSecret(secret)
	}
	return []remote.Option{remote.WithContext(ctx), remote.WithTransport(realmGuard{t}), remote.WithAuthFromKeychain(kc)}
}

// extract takes the module out of an image in either of Istio's layouts.
func extract(img v1.Image, max int64) ([]byte, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("reading the manifest: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("reading the layers: %w", err)
	}
	if len(layers) == 0 {
		return nil, errors.New("the image has no layers")
	}
	if m.MediaType == types.DockerManifestSchema2 {
		return compatModule(layers[len(layers)-1], types.DockerLayer, max)
	}
	b, errCompat := compatModule(layers[len(layers)-1], types.OCILayer, max)
	if errCompat == nil {
		return b, nil
	}
	b, errOCI := artifactModule(layers, max)
	if errOCI == nil {
		return b, nil
	}
	return nil, fmt.Errorf("not a Wasm image: as the compat variant: %w; as the oci variant: %w", errCompat, errOCI)
}

// compatModule reads plugin.wasm from a tar.gz layer of media type want.
func compatModule(l v1.Layer, want types.MediaType, max int64) ([]byte, error) {
	mt, err := l.MediaType()
	if err != nil {
		return nil, fmt.Errorf("layer media type: %w", err)
	}
	if mt != want {
		return nil, fmt.Errorf("layer media type %s, want %s", mt, want)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("reading the layer: %w", err)
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		return nil, fmt.Errorf("layer is not a tar.gz: %w", err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("no %s in the layer", compatFileName)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the layer's tar: %w", err)
		}
		if path.Base(h.Name) == compatFileName {
			return readAtMost(tr, max)
		}
	}
}

// artifactModule reads the raw module layer of the two-layer "oci" variant. The layer is
// read as stored: go-containerregistry takes unknown layer types for compressed ones.
func artifactModule(layers []v1.Layer, max int64) ([]byte, error) {
	if len(layers) != 2 {
		return nil, fmt.Errorf("%d layers, want 2", len(layers))
	}
	for _, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			return nil, fmt.Errorf("layer media type: %w", err)
		}
		if mt != wasmLayerType {
			continue
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, fmt.Errorf("reading the layer: %w", err)
		}
		defer rc.Close()
		return readAtMost(rc, max)
	}
	return nil, fmt.Errorf("no layer of type %s", wasmLayerType)
}

// pullSecret is a keychain from a dockerconfigjson, the image pull secret istiod passes in
// ISTIO_META_WASM_IMAGE_PULL_SECRET.
type pullSecret []byte

func (s pullSecret) Resolve(target authn.Resource) (authn.Authenticator, error) {
	if bytes.Equal(s, []byte("null")) {
		return nil, errors.New("the image pull secret is null")
	}
	var cf configfile.ConfigFile
	if err := cf.LoadFromReader(bytes.NewReader(s)); err != nil {
		return nil, fmt.Errorf("reading the image pull secret: %w", err)
	}
	key := target.RegistryStr()
	if key == name.DefaultRegistry {
		key = authn.DefaultAuthKey
	}
	c, err := cf.GetAuthConfig(key)
	if err != nil {
		return nil, fmt.Errorf("credentials for %s in the image pull secret: %w", key, err)
	}
	if c.Username == "" && c.Password == "" && c.Auth == "" && c.IdentityToken == "" && c.RegistryToken == "" {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(authn.AuthConfig{
		Username: c.Username, Password: c.Password, Auth: c.Auth,
		IdentityToken: c.IdentityToken, RegistryToken: c.RegistryToken,
	}), nil
}
