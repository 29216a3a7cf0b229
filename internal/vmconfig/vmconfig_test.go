package vmconfig

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// clusterEnv is a cluster.env as `istioctl x workload entry configure` writes it.
const clusterEnv = `CANONICAL_REVISION='latest'
CANONICAL_SERVICE='ratings'
ISTIO_INBOUND_PORTS='*'
ISTIO_LOCAL_EXCLUDE_PORTS='15090,15021,15020'
ISTIO_METAJSON_LABELS='{"app":"ratings","service.istio.io/canonical-name":"ratings"}'
ISTIO_META_CLUSTER_ID='Kubernetes'
ISTIO_META_DNS_CAPTURE='true'
ISTIO_META_MESH_ID='mesh1'
ISTIO_META_NETWORK=''
ISTIO_META_WORKLOAD_NAME='ratings-vm'
ISTIO_NAMESPACE='vm-ns'
ISTIO_SERVICE='ratings.vm-ns'
ISTIO_SERVICE_CIDR='*'
POD_NAMESPACE='vm-ns'
SERVICE_ACCOUNT='ratings-sa'
TRUST_DOMAIN='cluster.local'
`

func TestParseEnvFile(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want [][2]string
	}{
		{"istioctl cluster.env", clusterEnv, nil}, // checked against bash below
		{"comments, blanks, export", "# a comment\n\nexport A=1\n  B=two # trailing\n#C=3\nexport\tD=4\n",
			[][2]string{{"A", "1"}, {"B", "two"}, {"D", "4"}}},
		{"quotes", `A='x y'"z"w B="a \"q\" \\ \$ \x" C= D=a#b E='' F="multi
line" G='it'\''s'`,
			[][2]string{{"A", "x yzw"}, {"B", `a "q" \ $ \x`}, {"C", ""}, {"D", "a#b"}, {"E", ""}, {"F", "multi\nline"}, {"G", "it's"}}},
		{"continuation", "A=one\\\ntwo\nB=\"x\\\ny\"\n", [][2]string{{"A", "onetwo"}, {"B", "xy"}}},
		{"later wins in order", "A=1\nA=2\n", [][2]string{{"A", "1"}, {"A", "2"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEnvFile(tt.in)
			if err != nil {
				t.Fatalf("ParseEnvFile: %v", err)
			}
			if tt.want != nil {
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("ParseEnvFile (-want +got):\n%s", diff)
				}
			}
			compareWithShell(t, tt.in, got)
		})
	}
}

func TestParseEnvFileErrors(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"command", "echo hi\n", "line 1: want KEY=VALUE"},
		{"no value", "A=1\nB\n", "line 2: want KEY=VALUE"},
		{"command after assignment", "A=1 run-me\n", `line 1: A: unexpected "run-me"`},
		{"expansion", "A=$HOME\n", "unsupported shell syntax"},
		{"expansion in double quotes", `A="${HOME}"`, "unsupported shell expansion"},
		{"command substitution", "A=`id`\n", "unsupported shell syntax"},
		{"unterminated single", "A='x\n", "unterminated '"},
		{"unterminated double", "A=\"x\n", "unterminated \""},
		{"bad name", "1A=x\n", "want KEY=VALUE"},
		{"semicolon", "A=1; B=2\n", "unsupported shell syntax"},
		{"crlf", "A=1\r\n", "carriage return"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseEnvFile(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseEnvFile(%q) = %v, want an error containing %q", tt.in, err, tt.want)
			}
		})
	}
}

// compareWithShell checks that bash, sourcing the file as istio-start.sh does, sets each
// variable to the value ParseEnvFile found last for it.
func compareWithShell(t *testing.T, text string, got [][2]string) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Log("no bash: not compared with the shell")
		return
	}
	file := filepath.Join(t.TempDir(), "file.env")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	last := map[string]string{}
	var keys []string
	for _, kv := range got {
		if _, ok := last[kv[0]]; !ok {
			keys = append(keys, kv[0])
		}
		last[kv[0]] = kv[1]
	}
	script := `set -a; . "$1"; shift; for k in "$@"; do printf '%s\0' "${!k}"; done`
	out, err := exec.Command(bash, append([]string{"-c", script, "bash", file}, keys...)...).Output()
	if err != nil {
		t.Fatalf("bash sourcing the file: %v", err)
	}
	vals := strings.Split(string(out), "\x00")
	for i, k := range keys {
		if vals[i] != last[k] {
			t.Errorf("%s = %q, bash says %q", k, last[k], vals[i])
		}
	}
}

func TestLoad(t *testing.T) {
	host := func() Host { return Host{Name: "vm-1", IP: "10.1.2.3"} }
	tests := []struct {
		name      string
		sidecar   string // "" for none
		cluster   string
		env       []string
		want      map[string]string // variables checked
		unset     []string          // variables that must stay unset
		cluster_  string            // --serviceCluster
		noMissing bool
	}{{
		name:    "istioctl files and istio-start.sh defaults",
		cluster: clusterEnv,
		env:     []string{"PATH=/usr/bin", "POD_NAMESPACE=from-unit"},
		want: map[string]string{
			"PATH":                   "/usr/bin",
			"ISTIO_META_DNS_CAPTURE": "true",
			"SERVICE_ACCOUNT":        "ratings-sa",
			"POD_NAMESPACE":          "vm-ns", // ISTIO_NAMESPACE, as the script sets it
			"POD_NAME":               "vm-1",
			"INSTANCE_IP":            "10.1.2.3",
			"CA_ADDR":                "istiod.istio-system.svc:15012",
			"PROV_CERT":              "ROOT/etc/certs",
			"OUTPUT_CERTS":           "ROOT/etc/certs",
			"PROXY_CONFIG":           "\nserviceCluster: ratings.vm-ns\ncontrolPlaneAuthPolicy: MUTUAL_TLS\ndiscoveryAddress: istiod.istio-system.svc:15012\n",
		},
		cluster_: "ratings.vm-ns",
	}, {
		name:    "sidecar.env, then cluster.env, over the process's environment",
		sidecar: "PROV_CERT=/opt/prov\nOUTPUT_CERTS=''\nISTIO_PILOT_PORT=15010\nA=sidecar\nB=sidecar\n",
		cluster: "B=cluster\nISTIO_SYSTEM_NAMESPACE=mesh-system\nISTIO_SVC_IP=192.0.2.7\nISTIO_CP_AUTH=NONE\n",
		env:     []string{"A=process", "B=process", "C=process", "POD_NAME=named"},
		want: map[string]string{
			"A": "sidecar", "B": "cluster", "C": "process",
			"POD_NAMESPACE": "default",
			"POD_NAME":      "named",
			"INSTANCE_IP":   "192.0.2.7",
			"CA_ADDR":       "istiod.mesh-system.svc:15010",
			"PROV_CERT":     "/opt/prov",
			"OUTPUT_CERTS":  "", // set but empty: kept, as ${OUTPUT_CERTS-/etc/certs}
			"PROXY_CONFIG":  "\nserviceCluster: rawvm\ncontrolPlaneAuthPolicy: NONE\ndiscoveryAddress: istiod.mesh-system.svc:15010\n",
		},
		cluster_: "rawvm",
	}, {
		name:    "explicit addresses and PROXY_CONFIG are kept",
		cluster: "PILOT_ADDRESS=istiod.example:15012\nCA_ADDR=ca.example:15012\nPROXY_CONFIG='discoveryAddress: x:1'\n",
		want: map[string]string{
			"CA_ADDR":      "ca.example:15012",
			"PROXY_CONFIG": "discoveryAddress: x:1",
		},
		cluster_: "rawvm",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if tt.sidecar != "" {
				write(t, filepath.Join(root, SidecarEnv), tt.sidecar)
			}
			write(t, filepath.Join(root, ClusterEnv), tt.cluster)
			vm, err := Load(root, tt.env, host)
			if err != nil {
				t.Fatal(err)
			}
			env := map[string]string{}
			for _, kv := range vm.Env {
				k, v, _ := strings.Cut(kv, "=")
				if _, dup := env[k]; dup {
					t.Errorf("%s appears twice in the environment", k)
				}
				env[k] = v
			}
			for k, want := range tt.want {
				want = strings.ReplaceAll(want, "ROOT", root)
				if got, ok := env[k]; !ok || got != want {
					t.Errorf("%s = %q (set: %v), want %q", k, got, ok, want)
				}
			}
			if vm.ServiceCluster != tt.cluster_ {
				t.Errorf("ServiceCluster = %q, want %q", vm.ServiceCluster, tt.cluster_)
			}
			wantMissing := []string{filepath.Join(root, MeshConfig), filepath.Join(root, RootCert), filepath.Join(root, Token)}
			if !slices.Equal(vm.Missing, wantMissing) {
				t.Errorf("Missing = %v, want %v", vm.Missing, wantMissing)
			}
		})
	}
}

func TestLoadNotAVM(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, SidecarEnv), "A=1\n") // installed by the package, not onboarding
	vm, err := Load(root, nil, func() Host { t.Fatal("host looked up"); return Host{} })
	if vm != nil || err != nil {
		t.Fatalf("Load without cluster.env = %+v, %v; want nil, nil", vm, err)
	}
}

func TestLoadNamedFilesAndAllPresent(t *testing.T) {
	root := t.TempDir()
	other := filepath.Join(t.TempDir(), "my-cluster.env")
	write(t, other, "ISTIO_NAMESPACE=ns1\n")
	for _, p := range []string{MeshConfig, RootCert, Token} {
		write(t, filepath.Join(root, p), "x")
	}
	vm, err := Load(root, []string{"ISTIO_CLUSTER_CONFIG=" + other, "ISTIO_SVC_IP=192.0.2.1", "POD_NAME=p"}, func() Host {
		t.Fatal("host looked up though ISTIO_SVC_IP and POD_NAME are set")
		return Host{}
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(vm.Env, "POD_NAMESPACE=ns1") || len(vm.Missing) != 0 || !slices.Equal(vm.Files, []string{other}) {
		t.Fatalf("Load = env %v, missing %v, files %v", vm.Env, vm.Missing, vm.Files)
	}
}

func TestLoadBadFile(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, ClusterEnv), "A=1\nB=$(curl example)\n")
	if _, err := Load(root, nil, nil); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("Load of a cluster.env with a command = %v, want an error at line 2", err)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// FuzzParseEnvFile: the parser never panics, and what it reads, written back with shell
// single quotes, reads back the same.
func FuzzParseEnvFile(f *testing.F) {
	for _, s := range []string{clusterEnv, "export A=1 B='x y' # c\n", `A="a \"q\" \\"`, "A=one\\\ntwo", "A='it'\\''s'"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		kvs, err := ParseEnvFile(text)
		if err != nil {
			return
		}
		var b strings.Builder
		for _, kv := range kvs {
			b.WriteString(kv[0] + "='" + strings.ReplaceAll(kv[1], "'", `'\''`) + "'\n")
		}
		again, err := ParseEnvFile(b.String())
		if err != nil {
			t.Fatalf("ParseEnvFile(%q) = %v, reading back %q", text, err, b.String())
		}
		if diff := cmp.Diff(kvs, again); diff != "" {
			t.Fatalf("ParseEnvFile(%q) read back differently (-first +again):\n%s", text, diff)
		}
	})
}
