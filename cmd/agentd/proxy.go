package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/agentd/agentd/internal/agent"
)

// proxyCommand is pilot-agent's `proxy [sidecar|router]`: it accepts every flag Istio's
// injection template and VM install pass, and ignores unknown ones as pilot-agent does, so
// that agentd (or a link to it named pilot-agent) is the istio-proxy entrypoint unchanged.
func proxyCommand() *cli.Command {
	return &cli.Command{
		Name:            "proxy",
		Usage:           "run as Istio's pilot-agent proxy: the helpers and Envoy (sidecar or router)",
		ArgsUsage:       "[sidecar|router] [pilot-agent flags]",
		SkipFlagParsing: true,
		Action: func(c *cli.Context) error {
			p, err := parseProxyFlags(c.Args().Slice())
			if err != nil {
				return err
			}
			level, json := p.logLevel(), p.bools["log_as_json"]
			if v := os.Getenv("AGENTD_LOG_LEVEL"); v != "" {
				level = hclog.LevelFromString(v)
			}
			log := hclog.New(&hclog.LoggerOptions{Name: "agentd", Level: level, JSONFormat: json, Output: os.Stderr})
			for _, f := range p.seen {
				log.Info("FLAG", "name", f[0], "value", f[1])
			}
			for _, f := range p.unknown {
				log.Info("ignoring unknown flag, as pilot-agent does", "flag", f)
			}
			disable, _ := strconv.ParseBool(os.Getenv("DISABLE_ENVOY"))
			a, err := agent.New(agent.Options{
				Root:         p.strings["root"],
				HelpersDir:   p.strings["helpers-dir"],
				DisableEnvoy: disable,
				DNSAddress:   os.Getenv("DNS_PROXY_ADDR"),
				Env:          os.Environ(),
				Log:          log,
				Proxy: agent.ProxyArgs{
					Type:              p.typ,
					Domain:            p.strings["domain"],
					MeshConfigFile:    p.strings["meshConfig"],
					ServiceCluster:    p.strings["serviceCluster"],
					LogLevel:          p.strings["proxyLogLevel"],
					ComponentLogLevel: p.strings["proxyComponentLogLevel"],
					Concurrency:       p.ints["concurrency"],
					TemplateFile:      p.strings["templateFile"],
					OutlierLogPath:    p.strings["outlierLogPath"],
					StsPort:           p.ints["stsPort"],
				},
			})
			if err != nil {
				return err
			}
			return a.Run(signalContext(log, a))
		},
	}
}

// proxyFlags are pilot-agent's proxy flags by kind; root and helpers-dir are agentd's own.
var proxyFlags = map[string]string{
	"domain": "string", "meshConfig": "string", "serviceCluster": "string", "proxyLogLevel": "string",
	"proxyComponentLogLevel": "string", "templateFile": "string", "outlierLogPath": "string",
	"tokenManagerPlugin": "string", "stsPort": "int", "concurrency": "int", "profiling": "bool",
	"log_output_level": "string", "log_as_json": "bool", "log_caller": "string", "log_stacktrace_level": "string",
	"log_target": "string", "log_rotate": "string", "log_rotate_max_age": "int", "log_rotate_max_size": "int",
	"log_rotate_max_backups": "int", "vklog": "int",
	"root": "string", "helpers-dir": "string",
}

type parsedProxyFlags struct {
	typ     string
	strings map[string]string
	ints    map[string]int
	bools   map[string]bool
	seen    [][2]string // flags given, in order
	unknown []string
}

// parseProxyFlags reads `[type] [flags]` as pilot-agent's cobra command does: --f=v, --f v
// and -f v forms; an unknown flag is skipped with the value that follows it, if any.
func parseProxyFlags(args []string) (*parsedProxyFlags, error) {
	p := &parsedProxyFlags{strings: map[string]string{}, ints: map[string]int{}, bools: map[string]bool{"profiling": true}}
	for i := 0; i < len(args); i++ {
		tok := args[i]
		if tok == "--" {
			continue
		}
		if !strings.HasPrefix(tok, "-") {
			if p.typ != "" {
				return nil, fmt.Errorf("unexpected argument %q", tok)
			}
			p.typ = tok
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(tok, "-"), "=")
		kind, known := proxyFlags[name]
		if !known {
			p.unknown = append(p.unknown, tok)
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
		p.seen = append(p.seen, [2]string{name, value})
		switch kind {
		case "string":
			p.strings[name] = value
		case "int":
			n, err := strconv.Atoi(value)
			if err != nil {
				return nil, fmt.Errorf("invalid argument %q for --%s: want an integer", value, name)
			}
			p.ints[name] = n
		case "bool":
			b := true
			if hasValue {
				var err error
				if b, err = strconv.ParseBool(value); err != nil {
					return nil, fmt.Errorf("invalid argument %q for --%s: want true or false", value, name)
				}
			}
			p.bools[name] = b
		}
	}
	return p, nil
}

// logLevel is the default scope's level of --log_output_level ("scope:level,…"; Istio's
// default is default:info).
func (p *parsedProxyFlags) logLevel() hclog.Level {
	for _, part := range strings.Split(p.strings["log_output_level"], ",") {
		scope, level, ok := strings.Cut(part, ":")
		if !ok {
			scope, level = "default", part
		}
		if scope == "default" && level != "" {
			if level == "warning" {
				level = "warn"
			}
			if level == "none" {
				return hclog.Off
			}
			return hclog.LevelFromString(level)
		}
	}
	return hclog.Info
}
