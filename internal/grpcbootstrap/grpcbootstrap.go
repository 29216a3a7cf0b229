// Package grpcbootstrap writes Istio's gRPC xDS bootstrap file (gRFC A27), with which a
// proxyless gRPC application resolves xds:/// targets through agentd's xDS socket.
package grpcbootstrap

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// ServerListenerNameTemplate is the listener name a proxyless gRPC server asks for, as
// istiod serves it (%s becomes the server's listening ip:port).
const ServerListenerNameTemplate = "xds.istio.io/grpc/lds/inbound/%s"

// certRefresh is how often gRPC re-reads the files of the file_watcher provider.
const certRefresh = 15 * time.Minute

// Options describe the bootstrap: where the xDS server is and who the node is.
type Options struct {
	// ServerURI is the xDS server: SocketURI(<root>/etc/istio/proxy/XDS) for agentd's proxy.
	ServerURI string
	NodeID    string
	Locality  *Locality
	// Metadata is the node metadata; GENERATOR is set to "grpc" so that istiod generates
	// proxyless resources.
	Metadata map[string]any
	// CertDir (Istio's OUTPUT_CERTS), when set, adds the file_watcher certificate provider
	// "default" over its cert-chain.pem, key.pem and root-cert.pem.
	CertDir string
}

// Locality is the node's locality.
type Locality struct {
	Region  string `json:"region,omitempty"`
	Zone    string `json:"zone,omitempty"`
	SubZone string `json:"sub_zone,omitempty"`
}

// Bootstrap is the JSON document gRPC reads from GRPC_XDS_BOOTSTRAP.
type Bootstrap struct {
	XDSServers                 []XDSServer                    `json:"xds_servers,omitempty"`
	Node                       *Node                          `json:"node,omitempty"`
	CertProviders              map[string]CertificateProvider `json:"certificate_providers,omitempty"`
	ServerListenerNameTemplate string                         `json:"server_listener_resource_name_template,omitempty"`
}

// XDSServer is one xDS server of the bootstrap.
type XDSServer struct {
	ServerURI      string         `json:"server_uri,omitempty"`
	ChannelCreds   []ChannelCreds `json:"channel_creds,omitempty"`
	ServerFeatures []string       `json:"server_features,omitempty"`
}

// ChannelCreds are the credentials gRPC uses towards the xDS server.
type ChannelCreds struct {
	Type string `json:"type,omitempty"`
}

// Node is the xDS node gRPC announces.
type Node struct {
	ID       string         `json:"id,omitempty"`
	Locality *Locality      `json:"locality,omitempty"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

// CertificateProvider is a gRPC certificate provider plugin instance.
type CertificateProvider struct {
	PluginName string            `json:"plugin_name,omitempty"`
	Config     FileWatcherConfig `json:"config"`
}

// FileWatcherConfig is the configuration of gRPC's file_watcher certificate provider.
type FileWatcherConfig struct {
	CertificateFile   string `json:"certificate_file,omitempty"`
	PrivateKeyFile    string `json:"private_key_file,omitempty"`
	CACertificateFile string `json:"ca_certificate_file,omitempty"`
	RefreshInterval   string `json:"refresh_interval,omitempty"`
}

// SocketURI is the gRPC target of a Unix socket path, made absolute.
func SocketURI(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("xDS socket path %s: %w", path, err)
	}
	return "unix://" + abs, nil
}

// New builds the bootstrap as istio-agent does.
func New(o Options) *Bootstrap {
	meta := make(map[string]any, len(o.Metadata)+1)
	for k, v := range o.Metadata {
		meta[k] = v
	}
	meta["GENERATOR"] = "grpc"
	b := &Bootstrap{
		XDSServers: []XDSServer{{
			ServerURI:      o.ServerURI,
			ChannelCreds:   []ChannelCreds{{Type: "insecure"}}, // a local socket
			ServerFeatures: []string{"xds_v3"},
		}},
		Node:                       &Node{ID: o.NodeID, Locality: o.Locality, Metadata: meta},
		ServerListenerNameTemplate: ServerListenerNameTemplate,
	}
	if o.CertDir != "" {
		b.CertProviders = map[string]CertificateProvider{"default": {
			PluginName: "file_watcher",
			Config: FileWatcherConfig{
				CertificateFile:   filepath.Join(o.CertDir, "cert-chain.pem"),
				PrivateKeyFile:    filepath.Join(o.CertDir, "key.pem"),
				CACertificateFile: filepath.Join(o.CertDir, "root-cert.pem"),
				RefreshInterval:   fmt.Sprintf("%ds", int(certRefresh.Seconds())),
			},
		}}
	}
	return b
}

// JSON is the bootstrap as gRPC reads it (indented as Istio writes it).
func (b *Bootstrap) JSON() ([]byte, error) {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode gRPC bootstrap: %w", err)
	}
	return data, nil
}

// WriteFile writes the bootstrap of o to path atomically (mode 0644, parent directory
// created 0700), as istio-agent does on every start.
func WriteFile(path string, o Options) error {
	data, err := New(o).JSON()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write gRPC bootstrap: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write gRPC bootstrap: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write gRPC bootstrap: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("write gRPC bootstrap: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write gRPC bootstrap: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write gRPC bootstrap: %w", err)
	}
	return nil
}
