package wasm

import (
	"bytes"
	"encoding/base64"
	"os"
	"strings"
	"testing"

	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/testing/ecdsclient"
	"github.com/agentd/agentd/internal/testing/logbuf"
	"github.com/agentd/agentd/internal/wasm/wasmtest"
)

func TestPullSecret(t *testing.T) {
	auth := base64.StdEncoding.EncodeToString([]byte("user:pass"))
	secret := pullSecret(`{"auths":{"registry.example.com":{"auth":"` + auth + `"},"https://index.docker.io/v1/":{"username":"hub","password":"pw"}}}`)
	tests := []struct {
		registry, wantUser, wantErr string
		anonymous                   bool
	}{
		{registry: "registry.example.com", wantUser: "user"},
		{registry: "index.docker.io", wantUser: "hub"},
		{registry: "other.example.com", anonymous: true},
	}
	for _, tc := range tests {
		reg, err := name.NewRegistry(tc.registry)
		if err != nil {
			t.Fatal(err)
		}
		a, err := secret.Resolve(reg)
		if err != nil {
			t.Fatalf("Resolve(%s): %v", tc.registry, err)
		}
		if tc.anonymous {
			if a != authn.Anonymous {
				t.Errorf("Resolve(%s) = %v, want anonymous", tc.registry, a)
			}
			continue
		}
		cfg, err := a.Authorization()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Username != tc.wantUser {
			t.Errorf("Resolve(%s) user = %q, want %q", tc.registry, cfg.Username, tc.wantUser)
		}
	}
	hub, _ := name.NewRegistry(name.DefaultRegistry)
	for _, bad := range []string{"null", "{not json"} {
		if _, err := pullSecret(bad).Resolve(hub); err == nil || !strings.Contains(err.Error(), "pull secret") {
			t.Errorf("Resolve with secret %q = %v, want an error about the pull secret", bad, err)
		}
	}
}

// TestPrivateRegistry: an OCI registry behind HTTP Basic auth (go-containerregistry's, the
// distribution API) gives the module only for the pull secret istiod passes in the
// WasmPlugin's VM config (ISTIO_META_WASM_IMAGE_PULL_SECRET: the secret's dockerconfigjson);
// without it, the filter falls back and the log and metrics say why.
func TestPrivateRegistry(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir()) // no credentials of this machine's keychain
	module := wasmtest.Module("private")
	srv := wasmtest.StartPrivate(t, module, "puller", "s3cret")
	secret := func(registry, password string) map[string]string {
		auth := base64.StdEncoding.EncodeToString([]byte("puller:" + password))
		return map[string]string{secretEnv: `{"auths":{"` + registry + `":{"auth":"` + auth + `"}}}`}
	}
	tests := []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{name: "pull secret", env: secret(srv.Registry, "s3cret"), ok: true},
		{name: "no pull secret"},
		{name: "wrong password", env: secret(srv.Registry, "wrong")},
		{name: "secret for another registry", env: secret("registry.example.com", "s3cret")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, m := newTestCache(t, Options{})
			var logs logbuf.Buffer
			c.log = hclog.New(&hclog.LoggerOptions{Output: &logs})
			url := "oci://" + srv.Images[wasmtest.Compat]
			res := []*anypb.Any{extension(t, &httpwasm.Wasm{Config: pluginConfig(remoteCode(url, ""), wasmv3.FailurePolicy_FAIL_CLOSED, tc.env)})}
			if err := NewConverter(c).Convert(t.Context(), res); err != nil {
				t.Fatal(err)
			}
			_, what, err := ecdsclient.Loads(res[0])
			if err != nil {
				t.Fatal(err)
			}
			if tc.ok {
				b, err := os.ReadFile(strings.TrimPrefix(what, "file:"))
				if err != nil || !bytes.Equal(b, module) {
					t.Fatalf("Envoy loads %s (%v), want the module; log:\n%s", what, err, logs.String())
				}
				if n := value(t, m.remoteFetches.WithLabelValues(fetchSuccess)); n != 1 {
					t.Errorf("successful fetches = %v, want 1", n)
				}
				return
			}
			if what != "deny" {
				t.Errorf("Envoy loads %s, want the deny-all fallback (FAIL_CLOSE)", what)
			}
			if l := logs.String(); !strings.Contains(l, "fetching the manifest of "+srv.Images[wasmtest.Compat]) || !strings.Contains(l, "UNAUTHORIZED") {
				t.Errorf("the log does not say the registry refused the pull:\n%s", l)
			}
			if n := value(t, m.remoteFetches.WithLabelValues(manifestFailure)); n != 1 {
				t.Errorf("manifest failures = %v, want 1", n)
			}
		})
	}
}
