package component_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/agentd/agentd/internal/bus"
	"github.com/agentd/agentd/internal/component"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/agentd/agentd/internal/proc.Start.func1.1"))
}

// TestStartRefusesWhatIsNotAHelper: each bad binary gives a clear error and leaves no process.
func TestStartRefusesWhatIsNotAHelper(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pidFile := filepath.Join(dir, "pid")
	tests := []struct {
		name, binary, want string
	}{
		{"not executable", write("plain", "#!/bin/sh\n", 0o644), "permission denied"},
		{"missing", filepath.Join(dir, "nope"), "no such file"},
		{"not a plugin", write("talker", "#!/bin/sh\necho hello\nexit 0\n", 0o755), "Unrecognized remote plugin message"},
		{"corrupt binary", write("corrupt", "\x7fELF\x02\x01\x01garbage", 0o755), "exec format error"},
		{"never answers", write("silent", "#!/bin/sh\necho $$ > "+pidFile+"\nexec sleep 600\n", 0o755), "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := component.Start(context.Background(), component.Spec{
				Name: "x", Binary: tt.binary, Bus: bus.New().Server(), Log: hclog.NewNullLogger(),
				StartTimeout: 500 * time.Millisecond,
			})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Start(%s) = %v, want an error containing %q", tt.name, err, tt.want)
			}
		})
	}
	if data, err := os.ReadFile(pidFile); err == nil {
		pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("the helper that never answered (pid %d) is still alive", pid)
		}
	} else {
		t.Errorf("the silent helper did not run: %v", err)
	}
}
