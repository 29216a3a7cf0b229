package wasm

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
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
