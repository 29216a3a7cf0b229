package main

import (
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

func TestFlagsFirst(t *testing.T) {
	cmds := []*cli.Command{swapCommand(), statusCommand()}
	tests := []struct{ in, want string }{
		{"agentd swap dns-proxy --binary /b --sha256 ab", "agentd swap --binary /b --sha256 ab -- dns-proxy"},
		{"agentd swap --binary=/b dns-proxy", "agentd swap --binary=/b -- dns-proxy"},
		{"agentd status --json --root /r", "agentd status --json --root /r"},
		{"agentd status", "agentd status"},
		{"agentd unknown a --b c", "agentd unknown a --b c"},
	}
	for _, tt := range tests {
		if got := strings.Join(flagsFirst(cmds, strings.Fields(tt.in)), " "); got != tt.want {
			t.Errorf("flagsFirst(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
