package deploy

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// istioVersion is the Istio release the image builds on: the one place the tests name it.
// The Dockerfile's ARG ISTIO_VERSION holds it, the Makefile and the build read it from there.
const istioVersion = "1.30.3"

// instruction is one Dockerfile instruction: its keyword (upper case) and the rest, with
// line continuations joined.
type instruction struct{ cmd, args string }

// parseDockerfile splits a Dockerfile into instructions, leaving out comments and blank lines,
// as docker build reads it (no parser directives are used here).
func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	if cur.Len() > 0 {
		t.Fatalf("%s ends inside a continued line", path)
	}
	return out
}

// stages groups the instructions by FROM; stage 0 holds the global ARGs before the first FROM.
func stages(ins []instruction) [][]instruction {
	out := [][]instruction{nil}
	for _, in := range ins {
		if in.cmd == "FROM" {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], in)
	}
	return out
}

// TestDockerfile: the image builds agentd in a Go stage and installs it as pilot-agent in
// Istio's proxy image of the pinned release, its helpers as links beside it, with Istio's
// working directory and entrypoint; the pinned release also goes into agentd's build.
func TestDockerfile(t *testing.T) {
	const path = "docker/Dockerfile"
	data, _ := os.ReadFile(path)
	if n := strings.Count(string(data), istioVersion); n != 1 {
		t.Errorf("%s names %s %d times, want once (ARG ISTIO_VERSION)", path, istioVersion, n)
	}
	st := stages(parseDockerfile(t, path))
	if len(st) != 3 {
		t.Fatalf("%s has %d stages, want a build stage and the image", path, len(st)-1)
	}
	if !slices.Contains(st[0], instruction{"ARG", "ISTIO_VERSION=" + istioVersion}) {
		t.Errorf("global arguments %v, want ARG ISTIO_VERSION=%s", st[0], istioVersion)
	}

	build, image := st[1], st[2]
	if build[0] != (instruction{"FROM", "golang:1.26 AS build"}) {
		t.Errorf("build stage %v, want FROM golang:1.26 AS build", build[0])
	}
	if !slices.Contains(build, instruction{"ARG", "ISTIO_VERSION"}) {
		t.Error("the build stage does not take ISTIO_VERSION: agentd would report another Istio version")
	}
	run := ""
	for _, in := range build {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			run = in.args
		}
	}
	for _, want := range []string{
		"CGO_ENABLED=0 go build",
		"-tags urfave_cli_no_docs,grpcnotrace",
		"-X github.com/agentd/agentd/internal/buildinfo.IstioVersion=${ISTIO_VERSION}",
		"-X github.com/agentd/agentd/internal/buildinfo.Version=${VERSION}",
		"-o /out/pilot-agent ./cmd/agentd",
	} {
		if !strings.Contains(run, want) {
			t.Errorf("build command %q lacks %q", run, want)
		}
	}
	links := regexp.MustCompile(`for h in ([a-z -]+); do ln -s pilot-agent /out/\$h; done`).FindStringSubmatch(run)
	if links == nil || !slices.Equal(strings.Fields(links[1]), []string{"agentd", "xds-proxy", "sds-server", "dns-proxy", "prober"}) {
		t.Errorf("build command %q does not link agentd and every helper to pilot-agent", run)
	}

	want := []instruction{
		{"FROM", "docker.io/istio/proxyv2:${ISTIO_VERSION}-distroless"},
		{"COPY", "--from=build /out/ /usr/local/bin/"},
		{"WORKDIR", "/"},
		{"ENTRYPOINT", `["/usr/local/bin/pilot-agent"]`},
	}
	if !slices.Equal(image, want) {
		t.Errorf("image stage\n%v\nwant Istio's proxy image with agentd as pilot-agent\n%v", image, want)
	}
}

// TestMakefileIstioVersion: make builds agentd for the Dockerfile's Istio release.
func TestMakefileIstioVersion(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is needed to check the Makefile: %v", err)
	}
	out, err := exec.Command("make", "-s", "-C", "..", "istio-version").Output()
	if err != nil || strings.TrimSpace(string(out)) != istioVersion {
		t.Errorf("make istio-version = %q, %v; want %s", out, err, istioVersion)
	}
	out, err = exec.Command("make", "-n", "-C", "..", "build").Output()
	if want := "-X github.com/agentd/agentd/internal/buildinfo.IstioVersion=" + istioVersion; err != nil || !strings.Contains(string(out), want) {
		t.Errorf("make -n build = %q, %v; want %s", out, err, want)
	}
}
