package settings

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// ProxyCommand is `agentd proxy [sidecar|router] [flags]` (pilot-agent's command line) read.
type ProxyCommand struct {
	Flags    Flags
	LogLevel hclog.Level // --log_output_level's default scope (Istio: info)
	Seen     [][2]string // the flags given, in order
	Unknown  []string    // flags pilot-agent does not have either: ignored, as pilot-agent does
}

// proxyFlagKinds are the flags of `pilot-agent proxy` by kind (Ignored lists the ones agentd
// accepts and leaves alone); root and helpers-dir are agentd's own.
var proxyFlagKinds = map[string]string{
	"domain": "string", "meshConfig": "string", "serviceCluster": "string", "proxyLogLevel": "string",
	"proxyComponentLogLevel": "string", "templateFile": "string", "outlierLogPath": "string",
	"tokenManagerPlugin": "string", "stsPort": "int", "concurrency": "int", "profiling": "bool",
	"log_output_level": "string", "log_as_json": "bool", "log_caller": "string", "log_stacktrace_level": "string",
	"log_target": "string", "log_rotate": "string", "log_rotate_max_age": "int", "log_rotate_max_size": "int",
	"log_rotate_max_backups": "int", "vklog": "int",
	"root": "string", "helpers-dir": "string",
}

// ParseProxyCommand reads `[type] [flags]` as pilot-agent's cobra command does: --f=v, --f v
// and -f v forms; an unknown flag is skipped with the value that follows it, if any.
func ParseProxyCommand(args []string) (*ProxyCommand, error) {
	strs, ints, bools := map[string]string{}, map[string]int{}, map[string]bool{"profiling": true}
	p := &ProxyCommand{}
	for i := 0; i < len(args); i++ {
		tok := args[i]
		if tok == "--" {
			continue
		}
		if !strings.HasPrefix(tok, "-") {
			if p.Flags.Proxy.Type != "" {
				return nil, fmt.Errorf("unexpected argument %q", tok)
			}
			p.Flags.Proxy.Type = tok
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(tok, "-"), "=")
		kind, known := proxyFlagKinds[name]
		if !known {
			p.Unknown = append(p.Unknown, tok)
			if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
			}
			continue
		}
		if !hasValue && kind != "bool" {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("flag needs an argument: %s", tok)
			}
			i++
			value = args[i]
		}
		p.Seen = append(p.Seen, [2]string{name, value})
		switch kind {
		case "string":
			strs[name] = value
		case "int":
			n, err := strconv.Atoi(value)
			if err != nil {
				return nil, fmt.Errorf("invalid argument %q for --%s: want an integer", value, name)
			}
			ints[name] = n
		case "bool":
			b := true
			if hasValue {
				var err error
				if b, err = strconv.ParseBool(value); err != nil {
					return nil, fmt.Errorf("invalid argument %q for --%s: want true or false", value, name)
				}
			}
			bools[name] = b
		}
	}
	p.Flags.Root, p.Flags.HelpersDir = strs["root"], strs["helpers-dir"]
	p.Flags.Proxy = ProxyFlags{
		Type:              p.Flags.Proxy.Type,
		Domain:            strs["domain"],
		MeshConfigFile:    strs["meshConfig"],
		ServiceCluster:    strs["serviceCluster"],
		LogLevel:          strs["proxyLogLevel"],
		ComponentLogLevel: strs["proxyComponentLogLevel"],
		Concurrency:       ints["concurrency"],
		TemplateFile:      strs["templateFile"],
		OutlierLogPath:    strs["outlierLogPath"],
		StsPort:           ints["stsPort"],
		DisableProfiling:  !bools["profiling"],
		LogAsJSON:         bools["log_as_json"],
	}
	p.LogLevel = logLevel(strs["log_output_level"])
	return p, nil
}

// logLevel is the default scope's level of --log_output_level ("scope:level,…"; Istio's
// default is default:info).
func logLevel(flag string) hclog.Level {
	for _, part := range strings.Split(flag, ",") {
		scope, level, ok := strings.Cut(part, ":")
		if !ok {
			scope, level = "default", part
		}
		if scope == "default" && level != "" {
			switch level {
			case "warning":
				level = "warn"
			case "none":
				return hclog.Off
			}
			return hclog.LevelFromString(level)
		}
	}
	return hclog.Info
}
