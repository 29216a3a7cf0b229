package bootstrap

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// CommandOptions are the parts of Envoy's command line that do not come from the Config.
type CommandOptions struct {
	BootstrapPath string // -c
	// LogLevel is --proxyLogLevel: "level,scope:level,…"; the plain token becomes -l and the
	// scoped ones --component-log-level.
	LogLevel string
	// ComponentLogLevel is the deprecated --proxyComponentLogLevel, used only when LogLevel
	// has no scoped tokens.
	ComponentLogLevel string
	EnableCoreDump    bool   // ISTIO_ENVOY_ENABLE_CORE_DUMP
	BootstrapOverride string // ISTIO_BOOTSTRAP_OVERRIDE: a YAML/JSON fragment for --config-yaml
	HostIP            string // HOST_IP, replaces $(HOST_IP) in the override
}

// Args is Envoy's argv after the binary, exactly as pilot-agent builds it.
func Args(c *Config, o CommandOptions) ([]string, error) {
	pc := c.ProxyConfig
	ipVersion := "v4"
	if allIPv6(c.IPs) {
		ipVersion = "v6"
	}
	flush := time.Second
	if pc.GetFileFlushInterval() != nil {
		flush = pc.GetFileFlushInterval().AsDuration()
	}
	args := []string{
		"-c", o.BootstrapPath,
		"--drain-time-s", strconv.Itoa(int(pc.GetDrainDuration().AsDuration().Seconds())),
		"--drain-strategy", "immediate",
		"--local-address-ip-version", ipVersion,
		"--file-flush-interval-msec", strconv.FormatInt(flush.Milliseconds(), 10),
		"--disable-hot-restart",
		"--allow-unknown-static-fields",
	}
	if kb := pc.GetFileFlushMinSizeKb(); kb > 0 {
		args = append(args, "--file-flush-min-size-kb", strconv.FormatUint(uint64(kb), 10))
	}
	level, scoped := SplitLogLevel(o.LogLevel)
	if level != "" {
		args = append(args, "-l", level)
	}
	if len(scoped) > 0 {
		args = append(args, "--component-log-level", strings.Join(scoped, ","))
	} else if o.ComponentLogLevel != "" {
		args = append(args, "--component-log-level", o.ComponentLogLevel)
	}
	if c.SkipDeprecatedLogs {
		args = append(args, "--skip-deprecated-logs")
	}
	if o.EnableCoreDump {
		args = append(args, "--enable-core-dump")
	}
	if o.BootstrapOverride != "" {
		// A file that cannot be read is warned about and left out, as Istio does.
		if js, err := readBootstrapOverride(o.BootstrapOverride, o.HostIP); err != nil {
			c.warn("ignoring ISTIO_BOOTSTRAP_OVERRIDE, as Istio does", "error", err)
		} else {
			args = append(args, "--config-yaml", js)
		}
	}
	if n := pc.GetConcurrency(); n != nil && n.Value > 0 {
		args = append(args, "--concurrency", strconv.Itoa(int(n.Value)))
	}
	return args, nil
}

// SplitLogLevel splits Istio's "level,scope:level,…" into Envoy's -l level and its
// component levels; malformed tokens are dropped, as Istio does.
func SplitLogLevel(s string) (level string, scoped []string) {
	if s == "" {
		return "", nil
	}
	for _, tok := range strings.Split(s, ",") {
		switch strings.Count(tok, ":") {
		case 0:
			level = tok
		case 1:
			scoped = append(scoped, tok)
		}
	}
	return level, scoped
}

// readBootstrapOverride reads ISTIO_BOOTSTRAP_OVERRIDE's file as JSON, with $(HOST_IP)
// replaced by hostIP (bracketed when it is IPv6).
func readBootstrapOverride(path, hostIP string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read ISTIO_BOOTSTRAP_OVERRIDE: %w", err)
	}
	if strings.Contains(hostIP, ":") {
		hostIP = "[" + hostIP + "]"
		b = bytes.ReplaceAll(b, []byte("[$(HOST_IP)]"), []byte(hostIP))
	}
	b = bytes.ReplaceAll(b, []byte("$(HOST_IP)"), []byte(hostIP))
	js, err := yaml.YAMLToJSON(b)
	if err != nil {
		return "", fmt.Errorf("ISTIO_BOOTSTRAP_OVERRIDE %s: %w", path, err)
	}
	return string(js), nil
}

func allIPv6(ips []string) bool {
	if len(ips) == 0 {
		return false
	}
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Unmap().Is4() {
			return false
		}
	}
	return true
}
