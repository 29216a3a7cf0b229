package component

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/agentd/agentd/internal/proc"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// StateFileName is the LISTEN_FDNAMES name of the memory agentd keeps for a helper across
// its processes (Env.State).
const StateFileName = "agentd-state"

// Spec is how agentd starts one process of a helper.
type Spec struct {
	Name   string
	Binary string
	// Files are the inherited sockets, handed down from fd 3 on. They must be outside Go's
	// poller, as the supervisor opens them: os/exec would switch a polled one to blocking
	// mode, a mode the socket shares with the process still serving it during a swap.
	Files   []*os.File
	Sockets []string // their names, in the same order
	Env     []string // the helper's whole environment
	Config  proto.Message
	Root    string
	Bus     agentv1.BusServer
	Log     hclog.Logger // agentd's logger; the helper's lines appear under it with its name
	// StartTimeout bounds the fork, handshake and Configure (default 10 s).
	StartTimeout time.Duration
}

// Process is a running helper, seen from agentd. It implements supervisor.Instance.
type Process struct {
	name   string
	client *plugin.Client
	rpc    agentv1.ComponentClient
	run    *procRunner
}

// Start launches the helper binary, checks its protocol version in the handshake and
// configures it. On any error the process is gone when Start returns.
func Start(ctx context.Context, s Spec) (*Process, error) {
	if s.StartTimeout == 0 {
		s.StartTimeout = 10 * time.Second
	}
	var pr *procRunner
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  handshake(ProtocolVersion),
		Plugins:          plugin.PluginSet{pluginName: &grpcPlugin{}},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           pluginLogger{s.Log},
		StartTimeout:     s.StartTimeout,
		SkipHostEnv:      true,
		RunnerFunc: func(_ hclog.Logger, spec *exec.Cmd, _ string) (runner.Runner, error) {
			var err error
			if state := proc.State(ctx); state != nil {
				s.Files = append(slices.Clip(s.Files), state)
				s.Sockets = append(slices.Clip(s.Sockets), StateFileName)
			}
			pr, err = newProcRunner(s, spec.Env, proc.Executable(ctx))
			return pr, err
		},
	})
	p, err := start(ctx, client, s)
	if err != nil {
		client.Kill()
		if pr != nil && pr.proc != nil {
			pr.Kill(ctx)
			<-pr.proc.Done()
			if exit := pr.proc.Err(); exit != nil {
				err = fmt.Errorf("%w (helper process: %v)", err, exit)
			}
		}
		return nil, err
	}
	p.run = pr
	// A process that exits on its own (a crash, a kill -9) still holds go-plugin's connection,
	// broker and bus server: release them.
	go func() {
		<-pr.proc.Done()
		client.Kill()
	}()
	return p, nil
}

func start(ctx context.Context, client *plugin.Client, s Spec) (*Process, error) {
	cp, err := client.Client()
	if err != nil {
		if strings.Contains(err.Error(), "incompatible API version") {
			return nil, errVersion(s.Name, err)
		}
		return nil, fmt.Errorf("start helper %s (%s): %w", s.Name, s.Binary, err)
	}
	raw, err := cp.Dispense(pluginName)
	if err != nil {
		return nil, fmt.Errorf("dispense helper %s: %w", s.Name, err)
	}
	hs := raw.(*hostSide)
	busID := hs.broker.NextId()
	go hs.broker.AcceptAndServe(busID, func(opts []grpc.ServerOption) *grpc.Server {
		g := grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(agentv1.MaxBusMessage))...)
		agentv1.RegisterBusServer(g, s.Bus)
		return g
	})
	req := &agentv1.ConfigureRequest{Name: s.Name, Sockets: s.Sockets, BusBrokerId: busID, Root: s.Root}
	if s.Config != nil {
		if req.Config, err = anypb.New(s.Config); err != nil {
			return nil, fmt.Errorf("encode %s configuration: %w", s.Name, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.StartTimeout)
	defer cancel()
	if _, err := hs.client.Configure(ctx, req); err != nil {
		return nil, fmt.Errorf("configure helper %s: %w", s.Name, err)
	}
	return &Process{name: s.Name, client: client, rpc: hs.client}, nil
}

// Pid is the helper's process id.
func (p *Process) Pid() int { return p.run.proc.Pid() }

// Ready asks the helper whether it serves.
func (p *Process) Ready(ctx context.Context) error {
	r, err := p.rpc.Ready(ctx, &agentv1.ReadyRequest{})
	if err != nil {
		if code := status.Code(err); code == codes.DeadlineExceeded || code == codes.Canceled {
			err = context.DeadlineExceeded // the question was cut short: not the helper's answer
		}
		return fmt.Errorf("ask %s: %w", p.name, err)
	}
	if !r.GetReady() {
		return errors.New(r.GetReason())
	}
	return nil
}

// Drain asks the helper to stop serving by ctx's deadline.
func (p *Process) Drain(ctx context.Context) error {
	req := &agentv1.DrainRequest{}
	if d, ok := ctx.Deadline(); ok {
		req.Deadline = timestamppb.New(d)
	}
	if _, err := p.rpc.Drain(ctx, req); err != nil {
		return fmt.Errorf("drain %s: %w", p.name, err)
	}
	return nil
}

// Stop ends the helper: go-plugin's shutdown, then SIGKILL of its process group once ctx
// ends. It returns when the process has exited.
func (p *Process) Stop(ctx context.Context) error {
	killed := make(chan struct{})
	go func() {
		p.client.Kill() // asks nicely, waits up to 2 s, then kills
		close(killed)
	}()
	select {
	case <-p.run.proc.Done():
	case <-ctx.Done():
		p.run.proc.Kill()
		<-p.run.proc.Done()
	}
	<-killed
	return nil
}

// Exited is closed when the helper's process has exited.
func (p *Process) Exited() <-chan struct{} { return p.run.proc.Done() }

// Err tells how the helper exited.
func (p *Process) Err() error { return p.run.proc.Err() }

// Metrics fetches the helper's metrics.
func (p *Process) Metrics(ctx context.Context) ([]byte, error) {
	r, err := p.rpc.Metrics(ctx, &agentv1.MetricsRequest{})
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", p.name, err)
	}
	return r.GetText(), nil
}

// procRunner is go-plugin's runner for agentd's children: go-plugin's own cannot hand down
// sockets with their names, nor start the process through proc (process group, parent-death
// signal, reaping).
type procRunner struct {
	name   string
	cmd    *exec.Cmd
	proc   *proc.Process
	stdout io.ReadCloser
	stderr io.ReadCloser
}

// newProcRunner prepares the helper's command: exe, when set, is the open binary file to run
// (the one agentd verified), s.Binary only its name.
func newProcRunner(s Spec, pluginEnv []string, exe *os.File) (*procRunner, error) {
	cmd := exec.Command(s.Binary)
	cmd.Env = append(append([]string{}, s.Env...), pluginEnv...)
	if len(s.Files) > 0 {
		cmd.ExtraFiles = s.Files
		cmd.Env = append(cmd.Env,
			"LISTEN_FDS="+strconv.Itoa(len(s.Files)),
			"LISTEN_FDNAMES="+strings.Join(s.Sockets, ":"))
	}
	proc.UseExecutable(cmd, exe)
	cmd.Dir = s.Root
	// Plain pipes rather than cmd.StdoutPipe: os/exec closes those when the process is waited
	// for, which would lose the last lines a crashing helper wrote.
	r := &procRunner{name: s.Name, cmd: cmd}
	var err error
	if r.stdout, cmd.Stdout, err = os.Pipe(); err != nil {
		return nil, err
	}
	if r.stderr, cmd.Stderr, err = os.Pipe(); err != nil {
		r.stdout.Close()
		cmd.Stdout.(*os.File).Close()
		return nil, err
	}
	return r, nil
}

func (r *procRunner) Start(context.Context) error {
	p, err := proc.Start(r.cmd)
	// The child holds the write ends now; ours would keep the readers from ever seeing EOF.
	r.cmd.Stdout.(*os.File).Close()
	r.cmd.Stderr.(*os.File).Close()
	if err != nil {
		r.stdout.Close()
		r.stderr.Close()
		return err
	}
	r.proc = p
	return nil
}

func (r *procRunner) Wait(context.Context) error {
	if r.proc == nil {
		return errors.New("not started")
	}
	<-r.proc.Done()
	return r.proc.Err()
}

func (r *procRunner) Kill(context.Context) error {
	if r.proc == nil {
		return nil
	}
	return r.proc.Kill()
}

func (r *procRunner) Diagnose(context.Context) string {
	return fmt.Sprintf("is %s an agentd helper binary built for this machine, and executable?", r.cmd.Args[0])
}

func (r *procRunner) Stdout() io.ReadCloser { return r.stdout }
func (r *procRunner) Stderr() io.ReadCloser { return r.stderr }
func (r *procRunner) Name() string          { return r.name }
func (r *procRunner) ID() string {
	if r.proc == nil {
		return ""
	}
	return strconv.Itoa(r.proc.Pid())
}

func (r *procRunner) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (r *procRunner) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }

// pluginLogger demotes to debug go-plugin's two warnings about a shutdown request that raced
// with the helper's own exit: after a drain that is the normal way a helper ends.
type pluginLogger struct{ hclog.Logger }

func (l pluginLogger) Warn(msg string, args ...any) {
	if msg == "error closing client during Kill" || msg == "plugin failed to exit gracefully" {
		l.Logger.Debug(msg, args...)
		return
	}
	l.Logger.Warn(msg, args...)
}

func (l pluginLogger) Named(name string) hclog.Logger { return pluginLogger{l.Logger.Named(name)} }
