// Package pins holds blank imports of the pinned dependencies so that go mod tidy keeps them
// while the packages that use them are being written. Remove an import once real code uses it.
package pins

import (
	_ "github.com/coreos/go-systemd/v22/activation"
	_ "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/hashicorp/go-hclog"
	_ "github.com/hashicorp/go-plugin"
	_ "github.com/miekg/dns"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/urfave/cli/v2"
	_ "go.uber.org/goleak"
	_ "golang.org/x/sync/errgroup"
	_ "google.golang.org/grpc"
	_ "google.golang.org/protobuf/proto"
	_ "istio.io/api/mesh/v1alpha1"
	_ "istio.io/api/security/v1alpha1"
	_ "sigs.k8s.io/yaml"
)
