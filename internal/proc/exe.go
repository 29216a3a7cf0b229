package proc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
)

type (
	exeKey   struct{}
	stateKey struct{}
)

// WithState returns a context that carries state, memory that outlives each process of a
// child (a memfd agentd holds): a process started for that context inherits it.
func WithState(ctx context.Context, state *os.File) context.Context {
	return context.WithValue(ctx, stateKey{}, state)
}

// State is the file WithState put in ctx, or nil.
func State(ctx context.Context) *os.File {
	f, _ := ctx.Value(stateKey{}).(*os.File)
	return f
}

// WithExecutable returns a context that carries exe, an open executable file: a process
// started for that context runs that very file (UseExecutable), whatever file its path names
// by the time of the exec. That is how a verified binary is the one that runs.
func WithExecutable(ctx context.Context, exe *os.File) context.Context {
	return context.WithValue(ctx, exeKey{}, exe)
}

// Executable is the file WithExecutable put in ctx, or nil.
func Executable(ctx context.Context) *os.File {
	f, _ := ctx.Value(exeKey{}).(*os.File)
	return f
}

// UseExecutable makes cmd run the open file exe (as fexecve does) instead of the file at
// cmd.Path; argv[0] stays cmd.Args[0], so a binary that serves by the name it is run as
// still does. exe is handed down as the last of cmd.ExtraFiles, where os/exec places it at a
// known descriptor that no other file can take, and the exec opens it by /proc/self/fd: the
// child keeps that read-only descriptor of its own executable. Call it after every other
// change to cmd.ExtraFiles. A nil exe leaves cmd as it is.
func UseExecutable(cmd *exec.Cmd, exe *os.File) {
	if exe == nil {
		return
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, exe)
	if len(cmd.Args) == 0 {
		cmd.Args = []string{cmd.Path}
	}
	cmd.Path = fmt.Sprintf("/proc/self/fd/%d", 2+len(cmd.ExtraFiles))
}
