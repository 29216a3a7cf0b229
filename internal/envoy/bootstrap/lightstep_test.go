package bootstrap

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLightstepTokenFile: each bootstrap write, agentd's own or a rendered template's, writes
// Lightstep's access token where the bootstrap's access_token_file points (configPath under
// Envoy's working directory), readable by agentd's user only; a later write with another
// token replaces it. Without Lightstep no token file is written.
func TestLightstepTokenFile(t *testing.T) {
	tmpl := filepath.Join(istioReference(t), "envoy_bootstrap_tmpl.json")
	writers := []struct {
		name  string
		write func(c *Config, out string) error
	}{
		{"own", Write},
		{"template", func(c *Config, out string) error { return RenderFile(c, tmpl, out) }},
	}
	var lightstep goldenCase
	for _, g := range goldenCases {
		if g.name == "lightstep" {
			lightstep = g
		}
	}
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			root := t.TempDir() // Envoy's working directory
			c := lightstep.config(t)
			out := filepath.Join(root, OutputFile(c.ProxyConfig.GetConfigPath(), tmpl))
			for _, token := range []string{"abcdefg1234567", "rotated-token"} {
				c.ProxyConfig.GetTracing().GetLightstep().AccessToken = token
				if err := w.write(c, out); err != nil {
					t.Fatal(err)
				}
				data, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				ls := decode(t, data)["tracing"].(map[string]any)["http"].(map[string]any)["typed_config"].(map[string]any)
				tokenFile := filepath.Join(root, ls["access_token_file"].(string))
				got, err := os.ReadFile(tokenFile)
				if err != nil {
					t.Fatalf("the token file the bootstrap names: %v", err)
				}
				if string(got) != token {
					t.Errorf("%s holds %q, want %q", tokenFile, got, token)
				}
				if fi, err := os.Stat(tokenFile); err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("token file mode = %v (%v), want 0600", fi.Mode(), err)
				}
				if filepath.Dir(tokenFile) != filepath.Dir(out) {
					t.Errorf("token file %s is not beside the bootstrap %s", tokenFile, out)
				}
			}

			other := goldenCases[0].config(t)
			otherOut := filepath.Join(t.TempDir(), File)
			if err := w.write(other, otherOut); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(otherOut), LightstepTokenFile)); !os.IsNotExist(err) {
				t.Errorf("a token file without Lightstep: %v", err)
			}
		})
	}
}
