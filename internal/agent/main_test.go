package agent

import (
	"testing"

	"github.com/agentd/agentd/internal/settings"
)

// resolve is the Settings of an agentd started with flags and env in a temp root (unless
// flags names one), as `agentd run` resolves them.
func resolve(t testing.TB, flags settings.Flags, env ...string) *settings.Settings {
	t.Helper()
	if flags.Root == "" {
		flags.Root = t.TempDir()
	}
	if flags.HelpersDir == "" {
		flags.HelpersDir = t.TempDir()
	}
	s, err := settings.Resolve(flags, env, nil)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	return s
}
