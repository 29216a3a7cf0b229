package agent

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestHelperEnv(t *testing.T) {
	env := []string{
		"PATH=/usr/bin", "HOME=/root", "POD_NAME=app-1", "CA_ADDR=istiod:15012", "XDS_HEADER_Authorization=Bearer secret",
		"CA_HEADER_x=secret", "ISTIO_META_DNS_CAPTURE=true", "KUBERNETES_SERVICE_HOST=10.96.0.1",
		"GOMEMLIMIT=40MiB", "GOGC=50", "AGENTD_LOG_LEVEL=debug", "TZ=UTC", "HTTPS_PROXY=http://proxy:3128",
		"SSL_CERT_FILE=/etc/ssl/roots.pem", "notakeyvalue",
	}
	common := []string{"GOMEMLIMIT=40MiB", "GOGC=50", "AGENTD_LOG_LEVEL=debug", "TZ=UTC"}
	upstream := append(slices.Clone(common[:3]), "TZ=UTC", "HTTPS_PROXY=http://proxy:3128", "SSL_CERT_FILE=/etc/ssl/roots.pem")
	tests := []struct {
		helper string
		want   []string
	}{
		{"dns-proxy", common}, // it picks its own GOMAXPROCS
		{"prober", append(slices.Clone(common), "GOMAXPROCS=1")},
		{"xds-proxy", append([]string{"HOME=/root"}, append(slices.Clone(upstream), "GOMAXPROCS=1")...)}, // HOME: Docker's keychain
		{"sds-server", append(slices.Clone(upstream), "GOMAXPROCS=1")},
		{"unknown", append(slices.Clone(common), "GOMAXPROCS=1")},
	}
	for _, tt := range tests {
		if got := helperEnv(tt.helper, env); !slices.Equal(got, tt.want) {
			t.Errorf("helperEnv(%s) = %q, want %q", tt.helper, got, tt.want)
		}
	}
	// Without GOGC the helper applies the tree's from its first collection on (component.Serve).
	if got, want := helperEnv("dns-proxy", []string{"PATH=/bin", "GOMEMLIMIT=1GiB"}), []string{"GOMEMLIMIT=1GiB"}; !slices.Equal(got, want) {
		t.Errorf("helperEnv without GOGC = %q, want %q", got, want)
	}
	if got, want := helperEnv("prober", []string{"GOMAXPROCS=4"}), []string{"GOMAXPROCS=4"}; !slices.Equal(got, want) {
		t.Errorf("helperEnv with GOMAXPROCS = %q, want %q", got, want)
	}
}

// setByHost are the variables component.Start sets for every helper itself (the inherited
// sockets); they never come from agentd's environment.
var setByHost = []string{"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"}

// TestHelperEnvCoversGetenv reads the sources of every package of this module that each helper
// binary links, and checks that every variable they read with os.Getenv or os.LookupEnv is on
// the helper's allow-list: a new os.Getenv in a helper package fails here instead of silently
// reading nothing.
func TestHelperEnvCoversGetenv(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, helper := range []string{"dns-proxy", "xds-proxy", "sds-server", "prober"} {
		allowed := slices.Concat(helperEnvCommon, helperEnvAllowed[helper], setByHost)
		for _, read := range getenvCalls(t, "github.com/agentd/agentd/cmd/"+helper) {
			if !slices.Contains(allowed, read.name) {
				t.Errorf("%s links %s, which reads %s: not on the helper's allow-list (helperenv.go)", helper, read.at, read.name)
			}
		}
	}
}

type envRead struct{ name, at string }

// getenvCalls returns the environment reads in the module's packages that pkg depends on.
func getenvCalls(t *testing.T, pkg string) []envRead {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}|{{.Dir}}|{{join .GoFiles ","}}`, pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	var reads []envRead
	fset := token.NewFileSet()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.Split(line, "|")
		if len(parts) != 3 || !strings.HasPrefix(parts[0], "github.com/agentd/agentd/") || parts[2] == "" {
			continue
		}
		for _, name := range strings.Split(parts[2], ",") {
			f, err := parser.ParseFile(fset, filepath.Join(parts[1], name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) != 1 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || (sel.Sel.Name != "Getenv" && sel.Sel.Name != "LookupEnv") {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "os" {
					return true
				}
				at := fset.Position(call.Pos()).String()
				lit, ok := call.Args[0].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					reads = append(reads, envRead{name: "(not a constant)", at: at})
					return true
				}
				v, _ := strconv.Unquote(lit.Value)
				reads = append(reads, envRead{name: v, at: at})
				return true
			})
		}
	}
	if len(reads) == 0 {
		t.Fatalf("found no environment read in %s's packages: the scan is broken (component.Serve reads AGENTD_LOG_LEVEL)", pkg)
	}
	return reads
}
