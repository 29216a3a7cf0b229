package settings

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"
	meshv1 "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"
)

// TestPilotAgentCoverage: every variable and flag Istio's pilot-agent reads is in the Env
// table, or a flag agentd parses, or listed in Ignored with why; nothing is both.
func TestPilotAgentCoverage(t *testing.T) {
	f, err := os.Open("testdata/pilot-agent.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]bool{}
	for _, r := range Rows() {
		rows[r.Name] = true
	}
	parsed := []string{"domain", "meshConfig", "serviceCluster", "proxyLogLevel", "proxyComponentLogLevel", "templateFile",
		"outlierLogPath", "stsPort", "concurrency", "profiling", "log_output_level", "log_as_json"}
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		n++
		_, ignored := Ignored[name]
		var handled bool
		if flag, ok := strings.CutPrefix(name, "--"); ok {
			if _, accepted := proxyFlagKinds[flag]; !accepted {
				t.Errorf("pilot-agent's %s is not accepted by agentd proxy", name)
			}
			handled = slices.Contains(parsed, flag)
		} else {
			handled = rows[name]
		}
		switch {
		case handled && ignored:
			t.Errorf("%s is read and listed as ignored", name)
		case !handled && !ignored:
			t.Errorf("pilot-agent reads %s: agentd neither reads it nor lists it in Ignored with why", name)
		}
	}
	if n < 90 {
		t.Fatalf("read %d names from testdata/pilot-agent.txt, want the whole list", n)
	}
	for name, why := range Ignored {
		if why == "" {
			t.Errorf("Ignored[%s] says nothing of why", name)
		}
	}
}

// TestRows: every row names a variable, processes among agentd's and Istio's behaviour on a
// bad value.
func TestRows(t *testing.T) {
	procs := []string{"agentd", "envoy", "xds-proxy", "sds-server", "dns-proxy", "prober"}
	seen := map[string]bool{}
	for _, r := range Rows() {
		if r.Name == "" || seen[r.Name] {
			t.Errorf("row %s: variable %q empty or twice", r.Field, r.Name)
		}
		seen[r.Name] = true
		if r.Bad != Warn && r.Bad != Refuse {
			t.Errorf("row %s: bad = %q, want warn or refuse", r.Name, r.Bad)
		}
		for _, p := range r.To {
			if !slices.Contains(procs, p) {
				t.Errorf("row %s: process %q unknown", r.Name, p)
			}
		}
	}
}

// TestResolveBadValues: a value Istio warns about is replaced by Istio's default; one Istio
// refuses stops the start with the variable named.
func TestResolveBadValues(t *testing.T) {
	tests := []struct {
		env     string
		check   func(s *Settings) bool
		refused bool
	}{
		{"ISTIO_DELTA_XDS=maybe", func(s *Settings) bool { return s.Env.DeltaXDS }, false},
		{"ENVOY_STATUS_PORT=abc", func(s *Settings) bool { return s.Env.EnvoyStatusPort == 15021 }, false},
		{"SECRET_GRACE_PERIOD_RATIO=2", func(s *Settings) bool { return s.Env.GracePeriodRatio == 0.5 }, false},
		{"DNS_FORWARD_TIMEOUT=soon", func(s *Settings) bool { return s.Env.DNSForwardTimeout.D().Seconds() == 5 }, false},
		{"PROXY_CONFIG={", nil, true},
	}
	for _, tt := range tests {
		s, err := Resolve(Flags{Root: t.TempDir(), HelpersDir: t.TempDir()}, []string{tt.env}, nil)
		if tt.refused {
			name, _, _ := strings.Cut(tt.env, "=")
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("Resolve(%s) error = %v, want one naming %s", tt.env, err, name)
			}
			continue
		}
		if err != nil {
			t.Errorf("Resolve(%s): %v, want a warning and Istio's default", tt.env, err)
			continue
		}
		if !tt.check(s) {
			t.Errorf("Resolve(%s) = %+v, want Istio's default", tt.env, s.Env)
		}
	}
}

// TestStatusPortAnnotationThatDoesNotParse: status.sidecar.istio.io/port: abc starts agentd
// without a status server (port 0), as Istio's agent, instead of stopping it.
func TestStatusPortAnnotationThatDoesNotParse(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc/istio/pod"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/istio/pod/annotations"), []byte(`status.sidecar.istio.io/port="abc"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Resolve(Flags{Root: root, HelpersDir: root}, nil, nil)
	if err != nil {
		t.Fatalf("Resolve: %v, want a warning only", err)
	}
	if s.StatusPort != 0 {
		t.Errorf("status port = %d, want 0 (no status server)", s.StatusPort)
	}
}

// TestMergeAsPilotAgent: the mesh file, PROXY_CONFIG and the annotation of testdata/merge give
// the effective ProxyConfig Istio's pilot-agent logged for them (testdata/merge/README.md):
// top-level fields replaced whole, null left alone, proxyMetadata merged, proxyHeaders kept.
func TestMergeAsPilotAgent(t *testing.T) {
	root := t.TempDir()
	for src, dst := range map[string]string{"mesh.yaml": "etc/istio/config/mesh", "annotations": "etc/istio/pod/annotations"} {
		b, err := os.ReadFile(filepath.Join("testdata/merge", src))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, dst)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env, err := os.ReadFile("testdata/merge/proxy-config.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Resolve(Flags{Root: root, HelpersDir: root}, []string{"PROXY_CONFIG=" + strings.TrimSpace(string(env))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("testdata/merge/pilot-agent-effective.yaml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(want)
	if err != nil {
		t.Fatal(err)
	}
	wantPC := &meshv1.ProxyConfig{}
	if err := protojson.Unmarshal(js, wantPC); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(wantPC, s.ProxyConfig, protocmp.Transform()); d != "" {
		t.Errorf("merged ProxyConfig differs from pilot-agent's (-pilot-agent +agentd):\n%s", d)
	}
}
