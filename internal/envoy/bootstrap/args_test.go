package bootstrap

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestArgs(t *testing.T) {
	override := filepath.Join(t.TempDir(), "override.yaml")
	if err := os.WriteFile(override, []byte("tracing:\n  http:\n    name: x\n    address: \"$(HOST_IP):8126\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"-c", "etc/istio/proxy/envoy-rev.json", "--drain-time-s", "45", "--drain-strategy", "immediate",
		"--local-address-ip-version", "v4", "--file-flush-interval-msec", "1000", "--disable-hot-restart", "--allow-unknown-static-fields"}
	tests := []struct {
		name   string
		ips    []string
		modify func(*Config, *CommandOptions)
		want   []string
	}{
		{"injection template", []string{"10.0.0.1"}, func(c *Config, o *CommandOptions) {
			o.LogLevel, o.ComponentLogLevel, c.SkipDeprecatedLogs = "warning", "misc:error", true
		}, append(append([]string{}, base...), "-l", "warning", "--component-log-level", "misc:error", "--skip-deprecated-logs")},
		{"scoped levels win over the deprecated flag", []string{"10.0.0.1"}, func(c *Config, o *CommandOptions) {
			o.LogLevel, o.ComponentLogLevel = "info,misc:error,upstream:debug,bad:x:y", "misc:warning"
		}, append(append([]string{}, base...), "-l", "info", "--component-log-level", "misc:error,upstream:debug")},
		{"ipv6 only, concurrency, flush settings", []string{"fd00::1", "fd00::2"}, func(c *Config, o *CommandOptions) {
			c.ProxyConfig.Concurrency = wrapperspb.Int32(2)
			c.ProxyConfig.FileFlushInterval = durationpb.New(250e6)
			c.ProxyConfig.FileFlushMinSizeKb = 64
			c.ProxyConfig.DrainDuration = durationpb.New(30e9)
		}, []string{"-c", "etc/istio/proxy/envoy-rev.json", "--drain-time-s", "30", "--drain-strategy", "immediate",
			"--local-address-ip-version", "v6", "--file-flush-interval-msec", "250", "--disable-hot-restart", "--allow-unknown-static-fields",
			"--file-flush-min-size-kb", "64", "--concurrency", "2"}},
		{"core dump and override with an IPv6 HOST_IP", []string{"10.0.0.1"}, func(c *Config, o *CommandOptions) {
			o.EnableCoreDump, o.BootstrapOverride, o.HostIP = true, override, "fd00::9"
		}, append(append([]string{}, base...), "--enable-core-dump", "--config-yaml", `{"tracing":{"http":{"address":"[fd00::9]:8126","name":"x"}}}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Config{IPs: tt.ips, ProxyConfig: DefaultProxyConfig()}
			o := CommandOptions{BootstrapPath: File}
			tt.modify(c, &o)
			got, err := Args(c, o)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("Args() mismatch (-want +got):\n%s", d)
			}
		})
	}
}

// TestArgsMissingOverride: an ISTIO_BOOTSTRAP_OVERRIDE that cannot be read is warned about
// and left out, as Istio does.
func TestArgsMissingOverride(t *testing.T) {
	var warned []string
	c := &Config{IPs: []string{"10.0.0.1"}, ProxyConfig: DefaultProxyConfig(), Warn: func(m string, _ ...any) { warned = append(warned, m) }}
	args, err := Args(c, CommandOptions{BootstrapPath: File, BootstrapOverride: "/nonexistent/override.yaml"})
	if err != nil || slices.Contains(args, "--config-yaml") {
		t.Fatalf("Args = %q, %v; want no --config-yaml and no error", args, err)
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "ISTIO_BOOTSTRAP_OVERRIDE") {
		t.Errorf("warnings %q, want one about ISTIO_BOOTSTRAP_OVERRIDE", warned)
	}
}
