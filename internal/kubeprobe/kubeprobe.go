// Package kubeprobe is ISTIO_KUBE_APP_PROBERS: the kubelet probes Istio's injector rewrites to the
// status port, serialised as JSON, and Istio's rules for them. The prober runs them; agentd
// checks them at start, with Istio's messages.
package kubeprobe

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"sync"
)

// probePathPattern is Istio's rule for the keys of ISTIO_KUBE_APP_PROBERS, compiled on first
// use: compiled at start, it is 20 KB of heap in every process of agentd's executable.
var probePathPattern = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^/(app-health|app-lifecycle)/[^/]+/(livez|readyz|startupz|prestopz|poststartz)$`)
})

// KubeProbe is one kubelet probe as the injector serialises it into ISTIO_KUBE_APP_PROBERS:
// exactly one of HTTPGet, TCPSocket and GRPC, plus an optional timeout.
type KubeProbe struct {
	HTTPGet        *HTTPGetAction   `json:"httpGet,omitempty"`
	TCPSocket      *TCPSocketAction `json:"tcpSocket,omitempty"`
	GRPC           *GRPCAction      `json:"grpc,omitempty"`
	TimeoutSeconds int32            `json:"timeoutSeconds,omitempty"`
}

// HTTPGetAction is kubelet's httpGet. Host is accepted but never used: probes go to the pod.
type HTTPGetAction struct {
	Path        string       `json:"path,omitempty"`
	Port        IntOrString  `json:"port"`
	Host        string       `json:"host,omitempty"`
	Scheme      string       `json:"scheme,omitempty"`
	HTTPHeaders []HTTPHeader `json:"httpHeaders,omitempty"`
}

// HTTPHeader is one custom header of an httpGet probe.
type HTTPHeader struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// TCPSocketAction is kubelet's tcpSocket. Host is accepted but never used.
type TCPSocketAction struct {
	Port IntOrString `json:"port"`
	Host string      `json:"host,omitempty"`
}

// GRPCAction is kubelet's grpc probe.
type GRPCAction struct {
	Port    int32   `json:"port"`
	Service *string `json:"service,omitempty"`
}

// IntOrString is a Kubernetes port: a number, or a name the injector should have resolved.
type IntOrString struct {
	IsString bool
	Int      int
	Str      string
}

// UnmarshalJSON accepts a JSON number or string.
func (p *IntOrString) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		p.IsString = true
		return json.Unmarshal(b, &p.Str)
	}
	return json.Unmarshal(b, &p.Int)
}

// String is the port as written.
func (p IntOrString) String() string {
	if p.IsString {
		return p.Str
	}
	return strconv.Itoa(p.Int)
}

// ParseKubeProbes decodes and validates ISTIO_KUBE_APP_PROBERS with Istio's rules and
// messages. An empty string is no probes.
func ParseKubeProbes(s string) (map[string]*KubeProbe, error) {
	probes := map[string]*KubeProbe{}
	if s == "" {
		return probes, nil
	}
	if err := json.Unmarshal([]byte(s), &probes); err != nil {
		return nil, fmt.Errorf("failed to decode app prober err = %v, json string = %v", err, s)
	}
	for path, p := range probes {
		if err := validateKubeProbe(path, p); err != nil {
			return nil, err
		}
	}
	return probes, nil
}

func validateKubeProbe(path string, p *KubeProbe) error {
	if !probePathPattern().MatchString(path) {
		return fmt.Errorf("invalid path %q, must be in form of regex pattern %v", path, probePathPattern())
	}
	if p == nil {
		return fmt.Errorf("invalid prober config for %v: null", path)
	}
	kinds := 0
	for _, set := range []bool{p.HTTPGet != nil, p.TCPSocket != nil, p.GRPC != nil} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return fmt.Errorf("invalid prober type for %v, must be one of type httpGet, tcpSocket or gRPC", path)
	}
	if (p.HTTPGet != nil && p.HTTPGet.Port.IsString) || (p.TCPSocket != nil && p.TCPSocket.Port.IsString) {
		return fmt.Errorf("invalid prober config for %v, the port must be int type", path)
	}
	return nil
}
