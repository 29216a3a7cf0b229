// Package deploy checks agentd's deployment files: the Kubernetes manifests decode strictly
// into the Kubernetes API types and carry Istio's sidecar as its injector writes it, the
// injection values agree with them, and the VM install stages the systemd units.
package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"
)

// decodeStrict decodes YAML into out as the API server's strict decoding does: duplicate
// keys and fields that out's type does not have are errors.
func decodeStrict(data []byte, out any) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("decode %T: %w", out, err)
	}
	return nil
}

// documents splits a YAML stream at its "---" lines, leaving out empty documents.
func documents(data []byte) [][]byte {
	var out [][]byte
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) != "" {
			out = append(out, []byte(doc))
		}
	}
	return out
}

// podSpecs decodes every Kubernetes object under kubernetes/ strictly and returns the pod
// specs it holds, by file and object name. Files without a kind are Helm values (checked in
// TestInjectionValues).
func podSpecs(t *testing.T) map[string]*corev1.PodSpec {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests under kubernetes/: %v", err)
	}
	specs := map[string]*corev1.PodSpec{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range documents(data) {
			var meta struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			name := fmt.Sprintf("%s/%s", filepath.Base(f), meta.Kind)
			switch meta.APIVersion + "/" + meta.Kind {
			case "v1/Pod":
				var pod corev1.Pod
				if err := decodeStrict(doc, &pod); err != nil {
					t.Errorf("%s: %v", name, err)
				}
				specs[name] = &pod.Spec
			case "apps/v1/Deployment":
				var d appsv1.Deployment
				if err := decodeStrict(doc, &d); err != nil {
					t.Errorf("%s: %v", name, err)
				}
				specs[name] = &d.Spec.Template.Spec
			case "/":
				if !strings.HasSuffix(f, "-values.yaml") {
					t.Errorf("%s document %d has no apiVersion and kind", f, i)
				}
			default:
				t.Errorf("%s document %d: %s %s is not checked by this test: add it", f, i, meta.APIVersion, meta.Kind)
			}
		}
	}
	return specs
}

func TestManifestsDecodeStrictly(t *testing.T) {
	specs := podSpecs(t)
	for _, want := range []string{"pod.yaml/Pod", "pod-native.yaml/Pod", "deployment.yaml/Deployment"} {
		if specs[want] == nil {
			t.Errorf("no %s", want)
		}
	}
}

// TestDecodeStrictRejects checks that the strict decoding used above would catch the
// mistakes it is there for.
func TestDecodeStrictRejects(t *testing.T) {
	tests := []struct{ name, doc, want string }{
		{"unknown field", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: a\n    imagePullPolicyy: Always\n", "unknown field"},
		{"misplaced field", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: a\n    securityContext:\n      fsGroup: 1337\n", "unknown field"},
		{"duplicate key", "apiVersion: v1\nkind: Pod\nkind: Pod\n", "already set"},
		{"wrong type", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: a\n    ports:\n    - containerPort: \"80\"\n", "cannot unmarshal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := decodeStrict([]byte(tt.doc), &corev1.Pod{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("decodeStrict = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// istioArgs are the istio-proxy arguments of Istio's injection template with its default
// values; agentd takes them unchanged.
var istioArgs = []string{
	"proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local",
	"--proxyLogLevel=warning", "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info",
}

// istioEnv are variables Istio's template always gives istio-proxy, and agentd reads.
var istioEnv = []string{
	"PILOT_CERT_PROVIDER", "CA_ADDR", "POD_NAME", "POD_NAMESPACE", "INSTANCE_IP", "SERVICE_ACCOUNT",
	"HOST_IP", "PROXY_CONFIG", "ISTIO_META_POD_PORTS", "ISTIO_META_APP_CONTAINERS", "ISTIO_META_CLUSTER_ID",
	"ISTIO_META_INTERCEPTION_MODE", "ISTIO_META_WORKLOAD_NAME", "ISTIO_META_OWNER", "TRUST_DOMAIN",
}

// istioMounts are Istio's istio-proxy mounts (Kubernetes, istiod certificates,
// third-party JWT), then agentd's writable directories.
var istioMounts = map[string]string{
	"/var/run/secrets/workload-spiffe-uds":         "workload-socket",
	"/var/run/secrets/credential-uds":              "credential-socket",
	"/var/run/secrets/workload-spiffe-credentials": "workload-certs",
	"/var/run/secrets/istio":                       "istiod-ca-cert",
	"/var/lib/istio/data":                          "istio-data",
	"/etc/istio/proxy":                             "istio-envoy",
	"/var/run/secrets/tokens":                      "istio-token",
	"/etc/istio/pod":                               "istio-podinfo",
	"/var/run/agentd":                              "agentd-run",
	"/tmp":                                         "agentd-tmp",
}

func TestSidecarAsIstioInjectsIt(t *testing.T) {
	for name, spec := range podSpecs(t) {
		t.Run(name, func(t *testing.T) {
			proxy, native := sidecar(spec)
			if proxy == nil {
				t.Fatal("no istio-proxy container")
			}
			checkLayout(t, spec, proxy, native)
			if !slices.Equal(proxy.Args, istioArgs) || len(proxy.Command) != 0 {
				t.Errorf("istio-proxy command %q args %q, want the image's entrypoint with %q", proxy.Command, proxy.Args, istioArgs)
			}
			if !strings.Contains(proxy.Image, "agentd") {
				t.Errorf("istio-proxy image %q is not agentd's", proxy.Image)
			}
			env := map[string]bool{}
			for _, e := range proxy.Env {
				if env[e.Name] {
					t.Errorf("env %s set twice", e.Name)
				}
				env[e.Name] = true
			}
			for _, k := range istioEnv {
				if !env[k] {
					t.Errorf("env %s missing", k)
				}
			}
			checkPorts(t, proxy)
			checkSecurity(t, proxy)
			checkVolumes(t, spec, proxy)
			// agentd has no istio-iptables: istio-init runs Istio's image, of the release the
			// agentd image is built on.
			if init := container(spec.InitContainers, "istio-init"); init == nil || init.Image != "docker.io/istio/proxyv2:"+istioVersion {
				t.Errorf("istio-init %+v, want Istio's image docker.io/istio/proxyv2:%s", init, istioVersion)
			}
		})
	}
}

func checkPorts(t *testing.T, c *corev1.Container) {
	t.Helper()
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 15090 || c.Ports[0].Name != "http-envoy-prom" {
		t.Errorf("ports %+v, want Istio's http-envoy-prom 15090", c.Ports)
	}
	for probeName, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz/ready" || p.HTTPGet.Port.IntValue() != 15021 {
			t.Errorf("%s probe %+v, want GET :15021/healthz/ready (Envoy's health listener)", probeName, p)
		}
	}
}

func checkSecurity(t *testing.T, c *corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 1337 || sc.RunAsGroup == nil || *sc.RunAsGroup != 1337 ||
		sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("security context %+v, want Istio's: UID/GID 1337, non-root, read-only root, no escalation, all capabilities dropped", sc)
	}
}

// checkVolumes checks Istio's mounts and agentd's, and that every mount has its volume.
func checkVolumes(t *testing.T, spec *corev1.PodSpec, c *corev1.Container) {
	t.Helper()
	volumes := map[string]*corev1.Volume{}
	for i := range spec.Volumes {
		volumes[spec.Volumes[i].Name] = &spec.Volumes[i]
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
		if volumes[m.Name] == nil {
			t.Errorf("mount %s: no volume %s", m.MountPath, m.Name)
		}
	}
	for path, name := range istioMounts {
		if mounts[path] != name {
			t.Errorf("mount at %s is %q, want volume %q", path, mounts[path], name)
		}
	}
	tok := volumes["istio-token"]
	if tok == nil || tok.Projected == nil || len(tok.Projected.Sources) != 1 || tok.Projected.Sources[0].ServiceAccountToken == nil ||
		tok.Projected.Sources[0].ServiceAccountToken.Audience != "istio-ca" || tok.Projected.Sources[0].ServiceAccountToken.Path != "istio-token" {
		t.Errorf("istio-token volume %+v, want the projected token istio-token, audience istio-ca", tok)
	}
	if v := volumes["istiod-ca-cert"]; v == nil || v.ConfigMap == nil || v.ConfigMap.Name != "istio-ca-root-cert" {
		t.Errorf("istiod-ca-cert volume %+v, want ConfigMap istio-ca-root-cert", v)
	}
}

// TestInjectionValues checks the agentd injection template in both layouts Istio's injector
// writes: rendered as the injector renders it (NativeSidecars from ENABLE_NATIVE_SIDECARS,
// the sidecar.istio.io/nativeSidecar annotation over it), it decodes strictly, and merged
// over the pod Istio's sidecar template alone gives (the example pod of that layout with
// Istio's image and without agentd's volumes) by the injector's strategic merge, it gives
// the example pod.
func TestInjectionValues(t *testing.T) {
	data, err := os.ReadFile("kubernetes/istiod-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		SidecarInjectorWebhook struct {
			DefaultTemplates []string          `json:"defaultTemplates"`
			Templates        map[string]string `json:"templates"`
		} `json:"sidecarInjectorWebhook"`
	}
	if err := decodeStrict(data, &values); err != nil {
		t.Fatal(err)
	}
	if got := values.SidecarInjectorWebhook.DefaultTemplates; !slices.Equal(got, []string{"sidecar", "agentd"}) {
		t.Errorf("defaultTemplates = %v, want Istio's sidecar, then agentd", got)
	}
	tmpl, err := template.New("agentd").Funcs(template.FuncMap{"default": sprigDefault}).Option("missingkey=zero").
		Parse(values.SidecarInjectorWebhook.Templates["agentd"])
	if err != nil {
		t.Fatalf("agentd template: %v", err)
	}
	specs := podSpecs(t)
	tests := []struct {
		name       string
		native     bool   // NativeSidecars, from ENABLE_NATIVE_SIDECARS and the nodes
		annotation string // sidecar.istio.io/nativeSidecar
		example    string
	}{
		{"containers", false, "", "pod.yaml/Pod"},
		{"native sidecar", true, "", "pod-native.yaml/Pod"},
		{"native sidecar by annotation", false, "true", "pod-native.yaml/Pod"},
		{"containers by annotation", true, "false", "pod.yaml/Pod"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			meta := metav1.ObjectMeta{Annotations: map[string]string{}}
			if tt.annotation != "" {
				meta.Annotations["sidecar.istio.io/nativeSidecar"] = tt.annotation
			}
			var out bytes.Buffer
			if err := tmpl.Execute(&out, map[string]any{"ObjectMeta": meta, "NativeSidecars": tt.native}); err != nil {
				t.Fatalf("render agentd template: %v", err)
			}
			var overlay corev1.Pod
			if err := decodeStrict(out.Bytes(), &overlay); err != nil {
				t.Fatalf("rendered agentd template: %v\n%s", err, out.Bytes())
			}
			want := specs[tt.example]
			if want == nil {
				t.Fatalf("no %s", tt.example)
			}
			got := inject(t, istioOnly(t, want), out.Bytes())
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("Istio's pod with the agentd template merged differs from %s (-%s +merged):\n%s", tt.example, tt.example, d)
			}
		})
	}
}

// istioOnly is spec as Istio's sidecar template alone gives it: Istio's image for
// istio-proxy, without the volumes the agentd template adds.
func istioOnly(t *testing.T, spec *corev1.PodSpec) *corev1.PodSpec {
	t.Helper()
	out := spec.DeepCopy()
	proxy, _ := sidecar(out)
	proxy.Image = "docker.io/istio/proxyv2:" + istioVersion
	agentd := func(name string) bool { return strings.HasPrefix(name, "agentd-") }
	proxy.VolumeMounts = slices.DeleteFunc(proxy.VolumeMounts, func(m corev1.VolumeMount) bool { return agentd(m.Name) })
	out.Volumes = slices.DeleteFunc(out.Volumes, func(v corev1.Volume) bool { return agentd(v.Name) })
	return out
}

// inject merges the rendered template over spec as Istio's injector does (a strategic merge
// patch of the pod: lists of containers, mounts and volumes merged by name).
func inject(t *testing.T, spec *corev1.PodSpec, overlayYAML []byte) *corev1.PodSpec {
	t.Helper()
	orig, err := json.Marshal(corev1.Pod{Spec: *spec})
	if err != nil {
		t.Fatal(err)
	}
	patch, err := yaml.YAMLToJSON(overlayYAML)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := strategicpatch.StrategicMergePatch(orig, patch, corev1.Pod{})
	if err != nil {
		t.Fatalf("merge the agentd template: %v", err)
	}
	var pod corev1.Pod
	if err := json.Unmarshal(merged, &pod); err != nil {
		t.Fatal(err)
	}
	return &pod.Spec
}

// sprigDefault is sprig's default, which Istio's templates use: given when it is not empty.
func sprigDefault(def any, given ...any) any {
	if len(given) == 0 || given[0] == nil || given[0] == "" {
		return def
	}
	return given[0]
}

// sidecar returns istio-proxy and whether it is a native sidecar (an init container).
func sidecar(spec *corev1.PodSpec) (*corev1.Container, bool) {
	if c := container(spec.InitContainers, "istio-proxy"); c != nil {
		return c, true
	}
	return container(spec.Containers, "istio-proxy"), false
}

// checkLayout checks istio-proxy's place as Istio's injector gives it: one istio-proxy; as a
// native sidecar, an init container after istio-init with restartPolicy Always and the
// preStop drain hook; else a container that Kubernetes does not restart on its own.
func checkLayout(t *testing.T, spec *corev1.PodSpec, proxy *corev1.Container, native bool) {
	t.Helper()
	if native && container(spec.Containers, "istio-proxy") != nil {
		t.Error("istio-proxy is both an init container and a container")
	}
	if !native {
		if proxy.RestartPolicy != nil {
			t.Errorf("istio-proxy in containers has restartPolicy %s, want none", *proxy.RestartPolicy)
		}
		return
	}
	if proxy.RestartPolicy == nil || *proxy.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("native istio-proxy restartPolicy %v, want Always", proxy.RestartPolicy)
	}
	names := make([]string, len(spec.InitContainers))
	for i, c := range spec.InitContainers {
		names[i] = c.Name
	}
	if !slices.Equal(names, []string{"istio-init", "istio-proxy"}) {
		t.Errorf("init containers %v, want istio-init then istio-proxy", names)
	}
	drain := []string{"pilot-agent", "request", "--debug-port=15020", "POST", "drain"}
	if l := proxy.Lifecycle; l == nil || l.PreStop == nil || l.PreStop.Exec == nil || !slices.Equal(l.PreStop.Exec.Command, drain) {
		t.Errorf("native istio-proxy lifecycle %+v, want preStop %q", proxy.Lifecycle, drain)
	}
}

func container(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}
