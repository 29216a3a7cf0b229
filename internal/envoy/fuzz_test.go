package envoy

import (
	"testing"
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
		bs, err := Bootstrap(c)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := MarshalBootstrap(bs); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseBootstrap(b *testing.B) {
	t := &testing.T{}
	bs, err := Bootstrap(goldenCases[0].config(t))
	if err != nil {
		b.Fatal(err)
	}
	data, err := MarshalBootstrap(bs)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseBootstrap(data); err != nil {
			b.Fatal(err)
		}
	}
}
