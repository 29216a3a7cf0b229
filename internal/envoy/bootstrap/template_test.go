package bootstrap

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentd/agentd/internal/testing/configcheck"
	"github.com/agentd/agentd/test/compat/jsondiff"
)

// istioReference is the folder of Istio's recorded outputs and its bootstrap template
// (../shared/reference/istio from the project's root; AGENTD_ISTIO_REFERENCE overrides).
func istioReference(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("AGENTD_ISTIO_REFERENCE")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "..", "shared", "reference", "istio")
	}
	if _, err := os.Stat(filepath.Join(dir, "envoy_bootstrap_tmpl.json")); err != nil {
		t.Fatalf("Istio's reference data (its bootstrap template): %v; set AGENTD_ISTIO_REFERENCE", err)
	}
	return dir
}

func decode(t *testing.T, data []byte) map[string]any {
	t.Helper()
	js, err := AsJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestOwnBootstrapIsIstiosTemplate: for every test configuration, agentd's own bootstrap is,
// as data, what Istio's template renders with Istio's option set; both pass Envoy's strict
// validation.
func TestOwnBootstrapIsIstiosTemplate(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(istioReference(t), "envoy_bootstrap_tmpl.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range goldenCases {
		t.Run(g.name, func(t *testing.T) {
			c := g.config(t)
			rendered, err := Render(c, text)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			own, err := Build(c)
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			for _, d := range jsondiff.Diff("", decode(t, own), decode(t, rendered)) {
				t.Errorf("own bootstrap vs Istio's template: %s", d)
			}
			js, _ := AsJSON(rendered)
			if _, err := configcheck.ParseBootstrap(js); err != nil {
				t.Errorf("the rendered bootstrap fails Envoy's validation: %v", err)
			}
		})
	}
}
