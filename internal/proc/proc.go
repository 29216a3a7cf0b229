// Package proc starts agentd's child processes so that none outlives agentd, waits for each
// with one goroutine, and, when agentd is PID 1 or a subreaper, reaps the orphans it inherits.
package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// Process is a started child. Its own goroutine waits for it; Done is closed once it exited.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

var (
	// mu orders starts against reaping: a child is in known from the moment it exists, so the
	// reaper never takes the exit status that its os/exec Wait is owed.
	mu    sync.Mutex
	known = map[int]bool{}

	spawnOnce sync.Once
	spawnc    chan func()
)

// Start starts cmd in its own process group with SIGKILL as its parent-death signal.
//
// Linux sends the parent-death signal when the thread that forked the child exits, not the
// process. Go ends threads whose goroutine locked them and did not unlock, so every fork is
// made from one goroutine locked to its thread for agentd's whole life.
func Start(cmd *exec.Cmd) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL

	spawnOnce.Do(func() {
		spawnc = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as agentd
			for f := range spawnc {
				f()
			}
		}()
	})
	errc := make(chan error, 1)
	spawnc <- func() {
		mu.Lock()
		defer mu.Unlock()
		err := cmd.Start()
		if err == nil {
			known[cmd.Process.Pid] = true
		}
		errc <- err
	}
	if err := <-errc; err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go p.wait()
	return p, nil
}

func (p *Process) wait() {
	p.err = p.cmd.Wait()
	mu.Lock()
	delete(known, p.cmd.Process.Pid)
	mu.Unlock()
	close(p.done)
}

// Pid is the process id, also the id of its process group.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process exited; valid once Done is closed.
func (p *Process) Err() error { return p.err }

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error {
	err := p.cmd.Process.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// Kill sends SIGKILL to the process's whole group, so nothing it started survives it.
func (p *Process) Kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := syscall.Kill(-p.Pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill process group %d: %w", p.Pid(), err)
	}
	return nil
}
