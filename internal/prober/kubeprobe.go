package prober

import "github.com/agentd/agentd/internal/kubeprobe"

// The probes the prober runs, as ISTIO_KUBE_APP_PROBERS has them (package kubeprobe).
type (
	KubeProbe       = kubeprobe.KubeProbe
	HTTPGetAction   = kubeprobe.HTTPGetAction
	HTTPHeader      = kubeprobe.HTTPHeader
	TCPSocketAction = kubeprobe.TCPSocketAction
	GRPCAction      = kubeprobe.GRPCAction
	IntOrString     = kubeprobe.IntOrString
)

// ParseKubeProbes parses ISTIO_KUBE_APP_PROBERS (kubeprobe.ParseKubeProbes).
var ParseKubeProbes = kubeprobe.ParseKubeProbes
