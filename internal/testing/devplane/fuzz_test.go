package devplane

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"sigs.k8s.io/yaml"
)

// FuzzParseServices: a services file, garbage included, never panics; what is accepted has a
// hostname and ports for every service, no hostname twice, and reads back the same once
// written out again.
func FuzzParseServices(f *testing.F) {
	f.Add([]byte("services:\n- hostname: reviews.default.svc.cluster.local\n  namespace: default\n  addresses: [10.96.0.12]\n  ports: [{name: grpc, port: 9080, protocol: GRPC}]\n  endpoints: [{address: 127.0.0.1, port: 50051}]\n"))
	f.Add([]byte("services: []\n"))
	f.Add([]byte("services:\n- hostname: a\n  ports: [{port: 70000}]\n"))
	f.Add([]byte("services:\n- {hostname: A., ports: [{port: 80}]}\n- {hostname: a, ports: [{port: 81}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		services, err := ParseServices(data)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, s := range services {
			if s.Hostname == "" || len(s.Ports) == 0 || seen[s.Hostname] || strings.ContainsAny(s.Hostname, "* \t") {
				t.Fatalf("accepted service %+v (seen before: %v)", s, seen[s.Hostname])
			}
			seen[s.Hostname] = true
		}
		out, err := yaml.Marshal(File{Services: services})
		if err != nil {
			t.Fatalf("write back: %v", err)
		}
		again, err := ParseServices(out)
		if err != nil {
			t.Fatalf("written back %s refused: %v", out, err)
		}
		if d := cmp.Diff(services, again, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("read back differs (-first +again):\n%s", d)
		}
	})
}
