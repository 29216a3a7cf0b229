package devplane

import (
	"fmt"
	"net/netip"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// File is the services file devplane serves:
//
//	services:
//	- hostname: reviews.default.svc.cluster.local
//	  namespace: default
//	  addresses: [10.96.0.12]
//	  ports: [{name: grpc, port: 9080, protocol: GRPC}]
//	  endpoints: [{address: 127.0.0.1, port: 50051}]
//	wasmPlugins:
//	- name: stats
//	  namespace: default
//	  url: oci://registry.example.com/wasm/stats:v1
type File struct {
	Services    []Service    `json:"services"`
	WasmPlugins []WasmPlugin `json:"wasmPlugins,omitempty"`
}

// Service is one service of the mesh.
type Service struct {
	Hostname  string     `json:"hostname"`
	Namespace string     `json:"namespace,omitempty"`
	Registry  string     `json:"registry,omitempty"`  // default "Kubernetes", as istiod names it
	Addresses []string   `json:"addresses,omitempty"` // the VIPs, also what DNS answers
	Ports     []Port     `json:"ports"`
	Endpoints []Endpoint `json:"endpoints,omitempty"`
}

// Port is one port of a service.
type Port struct {
	Name     string `json:"name,omitempty"`
	Port     uint32 `json:"port"`
	Protocol string `json:"protocol,omitempty"` // GRPC, HTTP, HTTP2 or TCP; default TCP
}

// Endpoint is one instance of a service.
type Endpoint struct {
	Address string `json:"address"`
	// Port is the instance's port for every service port; 0 means the service port itself.
	Port uint32 `json:"port,omitempty"`
	// Ports overrides Port per service port name, for services with several ports.
	Ports map[string]uint32 `json:"ports,omitempty"`
}

// registryKubernetes is the registry istiod gives Kubernetes services in the name table.
const registryKubernetes = "Kubernetes"

// LoadFile reads and checks a services file.
func LoadFile(path string) (File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("read services file: %w", err)
	}
	f, err := ParseFile(data)
	if err != nil {
		return File{}, fmt.Errorf("services file %s: %w", path, err)
	}
	return f, nil
}

// ParseServices decodes and checks the YAML of a services file, filling in defaults.
func ParseServices(data []byte) ([]Service, error) {
	f, err := ParseFile(data)
	return f.Services, err
}

// ParseFile decodes and checks the YAML of a services file, filling in defaults.
func ParseFile(data []byte) (File, error) {
	var f File
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return File{}, fmt.Errorf("decode: %w", err)
	}
	if err := f.check(); err != nil {
		return File{}, err
	}
	return f, nil
}

func (f *File) check() error {
	seen := map[string]bool{}
	for i := range f.Services {
		s := &f.Services[i]
		if err := s.check(); err != nil {
			return fmt.Errorf("service %d (%s): %w", i, s.Hostname, err)
		}
		if seen[s.Hostname] {
			return fmt.Errorf("service %d: hostname %s appears twice", i, s.Hostname)
		}
		seen[s.Hostname] = true
	}
	for i := range f.WasmPlugins {
		if err := f.WasmPlugins[i].check(); err != nil {
			return fmt.Errorf("wasm plugin %d (%s): %w", i, f.WasmPlugins[i].Name, err)
		}
	}
	return nil
}

func (s *Service) check() error {
	if s.Hostname == "" {
		return fmt.Errorf("no hostname")
	}
	s.Hostname = strings.ToLower(strings.TrimSuffix(s.Hostname, "."))
	if err := checkHostname(s.Hostname); err != nil {
		return err
	}
	if s.Namespace != "" && (strings.Contains(s.Namespace, ".") || checkHostname(s.Namespace) != nil) {
		return fmt.Errorf("namespace %q: not a DNS label", s.Namespace)
	}
	if s.Registry == "" {
		s.Registry = registryKubernetes
	}
	for _, a := range s.Addresses {
		if _, err := netip.ParseAddr(a); err != nil {
			return fmt.Errorf("address %q: %w", a, err)
		}
	}
	if len(s.Ports) == 0 {
		return fmt.Errorf("no ports")
	}
	for i := range s.Ports {
		p := &s.Ports[i]
		if p.Port == 0 || p.Port > 65535 {
			return fmt.Errorf("port %d: out of range", p.Port)
		}
		p.Protocol = strings.ToUpper(p.Protocol)
		switch p.Protocol {
		case "":
			p.Protocol = "TCP"
		case "GRPC", "HTTP", "HTTP2", "TCP":
		default:
			return fmt.Errorf("port %d: unknown protocol %q (want GRPC, HTTP, HTTP2 or TCP)", p.Port, p.Protocol)
		}
	}
	for _, e := range s.Endpoints {
		if _, err := netip.ParseAddr(e.Address); err != nil {
			return fmt.Errorf("endpoint %q: %w", e.Address, err)
		}
		for _, port := range append([]uint32{e.Port}, mapValues(e.Ports)...) {
			if port > 65535 {
				return fmt.Errorf("endpoint %s: port %d out of range", e.Address, port)
			}
		}
	}
	return nil
}

// checkHostname refuses what is not a DNS name of letters, digits and hyphens (RFC 1123): a
// wildcard, an empty label, a space. devplane serves hostnames to dns-proxy's table as they
// are, and a "*" there would answer as a name.
func checkHostname(h string) error {
	if len(h) > 253 {
		return fmt.Errorf("hostname %.20q...: longer than 253 characters", h)
	}
	for label := range strings.SplitSeq(h, ".") {
		if err := checkLabel(label); err != nil {
			return fmt.Errorf("hostname %q: %w", h, err)
		}
	}
	return nil
}

func checkLabel(l string) error {
	if l == "" || len(l) > 63 {
		return fmt.Errorf("label %q: empty or longer than 63 characters", l)
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return fmt.Errorf("label %q: starts or ends with a hyphen", l)
	}
	for _, c := range []byte(l) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("label %q: %q is not a letter, digit or hyphen", l, c)
		}
	}
	return nil
}

// portFor is the endpoint's port for service port p.
func (e Endpoint) portFor(p Port) uint32 {
	if port, ok := e.Ports[p.Name]; ok && p.Name != "" {
		return port
	}
	if e.Port != 0 {
		return e.Port
	}
	return p.Port
}

func mapValues(m map[string]uint32) []uint32 {
	out := make([]uint32, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
