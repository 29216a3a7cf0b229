package grpcbootstrap

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestWriteFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"plain", Options{
			ServerURI: "unix:///var/run/agentd/etc/istio/proxy/XDS",
			NodeID:    "sidecar~10.0.0.1~app-1.default~default.svc.cluster.local",
			Metadata:  map[string]any{"NAMESPACE": "default", "CLUSTER_ID": "Kubernetes", "LABELS": map[string]any{"app": "reviews"}},
		}},
		{"certs", Options{
			ServerURI: "unix:///etc/istio/proxy/XDS",
			NodeID:    "sidecar~10.0.0.1~app-1.default~default.svc.cluster.local",
			Locality:  &Locality{Region: "r1", Zone: "z1"},
			Metadata:  map[string]any{"GENERATOR": "envoy"}, // overridden
			CertDir:   "/var/lib/istio/data",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "etc", "istio", "proxy", "grpc-bootstrap.json")
			if err := WriteFile(path, tc.opts); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o644 {
				t.Errorf("mode = %v, want 0644", fi.Mode().Perm())
			}
			golden := filepath.Join("testdata", tc.name+".json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(string(want), string(got)); d != "" {
				t.Errorf("bootstrap (-want +got):\n%s", d)
			}
		})
	}
}

func TestSocketURI(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	got, err := SocketURI("etc/istio/proxy/XDS")
	if err != nil {
		t.Fatal(err)
	}
	if want := "unix://" + filepath.Join(dir, "etc/istio/proxy/XDS"); got != want {
		t.Errorf("SocketURI = %q, want %q", got, want)
	}
}
