package bootstrap

import (
	"testing"

	"github.com/agentd/agentd/internal/testing/configcheck"
)

// FuzzMergeProxyConfig: any PROXY_CONFIG text either merges into a ProxyConfig that passes
// validation or fails with an error; it never panics.
func FuzzMergeProxyConfig(f *testing.F) {
	for _, s := range []string{"", "{}", vmProxyConfig, `{"controlPlaneAuthPolicy":"NONE","statNameLength":0}`,
		"terminationDrainDuration: 20s\nproxyMetadata: {A: b}", "tracing: {zipkin: {address: z:9411}}", "concurrency: -1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		pc, err := MergeProxyConfig(ProxyConfigSources{Env: doc})
		if err == nil {
			if verr := ValidateProxyConfig(pc); verr != nil {
				t.Fatalf("merged config fails validation: %v", verr)
			}
		}
	})
}

// FuzzBootstrap: for any PROXY_CONFIG and pod annotations, agentd either rejects the input
// or writes a bootstrap that Envoy would accept: it decodes strictly and passes full
// validation. This is what keeps agentd's explicit checks in step with Envoy's rules.
func FuzzBootstrap(f *testing.F) {
	for _, g := range goldenCases {
		f.Add(g.proxyEnv+env(g.env, "PROXY_CONFIG"), g.annos)
	}
	f.Add("proxyStatsMatcher: {inclusionPrefixes: [\"\"]}", `sidecar.istio.io/statsFlushInterval="0s"`)
	f.Fuzz(func(t *testing.T, proxyConfig, annotations string) {
		annos, err := ParseDownwardAPI(annotations)
		if err != nil {
			return
		}
		c := goldenCases[0].config(t)
		c.Annotations = annos
		if c.ProxyConfig, err = MergeProxyConfig(ProxyConfigSources{Env: proxyConfig, Annotations: annos}); err != nil {
			return
		}
		data, err := Build(c)
		if err != nil {
			return
		}
		if _, err := configcheck.ParseBootstrap(data); err != nil {
			t.Fatalf("agentd wrote a bootstrap Envoy rejects: %v", err)
		}
	})
}

// FuzzParseDownwardAPI: the pod-info parser never panics and keeps only quoted values.
func FuzzParseDownwardAPI(f *testing.F) {
	f.Add(sidecarLabels)
	f.Add(sidecarAnnotations)
	f.Add("a=\"\\u00e9\"\nb")
	f.Fuzz(func(t *testing.T, s string) {
		ParseDownwardAPI(s)
	})
}

func BenchmarkBootstrap(b *testing.B) {
	t := &testing.T{}
	c := goldenCases[0].config(t)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Build(c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseBootstrap(b *testing.B) {
	t := &testing.T{}
	data, err := Build(goldenCases[0].config(t))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := configcheck.ParseBootstrap(data); err != nil {
			b.Fatal(err)
		}
	}
}
