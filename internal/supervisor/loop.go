package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/agentd/agentd/internal/proc"
)

// loop keeps one child running until ctx ends, then stops it.
func (s *Supervisor) loop(ctx context.Context, c *child) {
	defer s.setState(c, Stopped)
	defer func() {
		c.mu.Lock()
		c.exe.close()
		c.exe = nil
		c.mu.Unlock()
	}()

	c.mu.Lock()
	binary := c.Binary
	c.mu.Unlock()
	var inst Instance // set when a swap during backoff already started the next process
	for {
		if inst == nil {
			s.setState(c, Starting)
			var exe *openFile
			var err error
			inst, exe, err = s.launch(ctx, c, binary, nil)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				c.log.Error("start failed", "error", err)
				c.mu.Lock()
				c.lastErr = err
				c.mu.Unlock()
				if ownResources(err) { // agentd's trouble, not the helper's: not an exit
					s.setState(c, Backoff)
					if binary, inst = s.backoff(ctx, c, resourceRetry, binary); ctx.Err() != nil {
						if inst != nil {
							s.stop(c, inst)
						}
						return
					}
					continue
				}
			} else {
				s.adopt(c, inst, binary, "", exe)
			}
		}
		if inst != nil {
			restart := s.serve(ctx, c, inst)
			inst = nil
			if ctx.Err() != nil {
				return
			}
			c.mu.Lock()
			binary = c.status.Binary // a swap may have changed it
			if restart || time.Since(c.status.StartedAt) >= s.opts.Backoff.StableAfter {
				c.failures = 0
			}
			c.mu.Unlock()
			if restart {
				s.countRestart(c)
				continue
			}
		}

		c.mu.Lock()
		c.failures++
		n := c.failures
		c.mu.Unlock()
		wait := s.opts.Backoff.delayFor(n, len(c.Sockets) > 0)
		st := Backoff
		if n >= s.opts.Backoff.CrashLoopAfter {
			st = CrashLoop
		}
		s.setState(c, st)
		c.log.Info("restarting", "in", wait.Round(time.Millisecond), "exits_in_a_row", n, "state", st)
		binary, inst = s.backoff(ctx, c, wait, binary)
		if ctx.Err() != nil {
			if inst != nil {
				s.stop(c, inst)
			}
			return
		}
		s.countRestart(c)
	}
}

// resourceRetry is the wait before another start when the last one failed for lack of
// agentd's own resources (file descriptors, memory, processes): short, as the child is down,
// and not growing, as the child is not at fault.
const resourceRetry = 250 * time.Millisecond

// ownResources tells whether a start failed because agentd itself ran out of something: file
// descriptors (pipes, sockets, the binary's open file), memory, or processes.
func ownResources(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.EAGAIN} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// backoff waits before a restart. A restart command ends the wait; a swap command tries the
// new binary at once (the incident case: a crash-looping helper replaced by a fixed build) and,
// when it becomes ready, returns its running process to be served.
func (s *Supervisor) backoff(ctx context.Context, c *child, wait time.Duration, binary string) (string, Instance) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return binary, nil
		case <-t.C:
			return binary, nil
		case cmd := <-c.cmds:
			if cmd.kind == cmdRestart {
				cmd.reply <- nil
				return binary, nil
			}
			inst, sum, err := s.startNew(ctx, c, cmd)
			if err != nil {
				cmd.reply <- err
				continue
			}
			s.adopt(c, inst, cmd.binary, sum, nil)
			c.mu.Lock()
			c.failures = 0
			c.mu.Unlock()
			cmd.reply <- nil
			return cmd.binary, inst
		}
	}
}

// serve watches a running process until it exits, ctx ends (then it stops it), or a restart
// command stops it (then it returns true). Swap commands replace it in place.
func (s *Supervisor) serve(ctx context.Context, c *child, inst Instance) (restart bool) {
	hung, unwatch := s.watchHealth(ctx, c, inst)
	defer func() { unwatch() }()
	for {
		select {
		case err := <-hung:
			c.log.Error("hung: restarting it", "pid", inst.Pid(), "error", err)
			c.mu.Lock()
			c.lastErr = fmt.Errorf("pid %d hung: %w", inst.Pid(), err)
			c.mu.Unlock()
			s.stopWithin(c, inst, s.opts.CallTimeout)
			return true
		case <-inst.Exited():
			err := inst.Err()
			if err == nil {
				err = errors.New("exited with status 0")
			}
			c.log.Error("process exited", "pid", inst.Pid(), "error", err)
			c.mu.Lock()
			c.inst, c.lastErr = nil, fmt.Errorf("pid %d %w", inst.Pid(), err)
			c.status.Pid = 0
			c.mu.Unlock()
			return false
		case <-ctx.Done():
			s.stop(c, inst)
			return false
		case cmd := <-c.cmds:
			switch cmd.kind {
			case cmdRestart:
				c.log.Info("restart requested", "pid", inst.Pid())
				s.stop(c, inst)
				cmd.reply <- nil
				return true
			case cmdSwap:
				next, sum, err := s.startNew(ctx, c, cmd)
				if err != nil {
					cmd.reply <- err
					continue
				}
				c.log.Info("swap: new process ready, stopping the old one", "old_pid", inst.Pid(), "new_pid", next.Pid())
				unwatch()
				s.stop(c, inst)
				s.adopt(c, next, cmd.binary, sum, nil)
				inst = next
				hung, unwatch = s.watchHealth(ctx, c, inst)
				cmd.reply <- nil
			}
		}
	}
}

// watchHealth asks inst whether it is ready every HealthInterval, each call within
// CallTimeout. After HungAfter calls in a row without an answer (an answer "not ready" is an
// answer) from a process that answered before, or is past its ReadyTimeout, it sends the last
// error on hung and stops. unwatch stops it and waits for it.
func (s *Supervisor) watchHealth(ctx context.Context, c *child, inst Instance) (hung <-chan error, unwatch func()) {
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(s.opts.HealthInterval)
		defer tick.Stop()
		// A process that never answered yet may be starting slowly: it is hung only once past
		// its ReadyTimeout.
		started, missed := time.Now(), 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-inst.Exited():
				return
			case <-tick.C:
			}
			err := s.ready(ctx, c, inst, "health")
			if !errors.Is(err, errNoAnswer) {
				missed = 0
				continue
			}
			c.mu.Lock()
			answered := c.answered == inst
			c.mu.Unlock()
			if missed++; missed >= s.opts.HungAfter && (answered || time.Since(started) > c.ReadyTimeout) {
				out <- fmt.Errorf("%d health checks in a row got %w", missed, err)
				return
			}
		}
	}()
	return out, func() { cancel(); <-done }
}

// startNew starts a swap's binary beside the running process and waits until it is ready.
func (s *Supervisor) startNew(ctx context.Context, c *child, cmd command) (Instance, string, error) {
	c.log.Info("swap: starting new binary", "binary", cmd.binary, "sha256", cmd.sha256)
	inst, _, err := s.launch(ctx, c, cmd.binary, cmd.exe)
	if err == nil {
		if err = s.waitReady(ctx, inst, cmd.timeout); err != nil {
			s.stop(c, inst)
		}
	}
	if err != nil {
		c.log.Error("swap refused, the old process keeps serving", "binary", cmd.binary, "error", err)
		return nil, "", fmt.Errorf("swap %s to %s: %w (the old process keeps serving)", c.Name, cmd.binary, err)
	}
	c.log.Info("ready", "pid", inst.Pid(), "sha256", cmd.sha256)
	return inst, cmd.sha256, nil
}

// launch starts a process of c from binary: it runs and serves its sockets when launch
// returns. Whether it is ready is another question (a dns-proxy waits for its first name
// table): not being ready is reported, never a reason to kill it.
//
// The process runs the file launch opened, not whatever binary names by the time of the exec:
// the open file goes down in the context (proc.WithExecutable) to a Launch that execs it, and
// /proc/PID/exe is checked against it after the start, for a Launch that execs the path
// instead (Envoy). A swap hands in the file it opened and verified (verified): then a process
// that cannot be shown to run it is stopped and an error returned. Otherwise launch returns
// the open file the process runs, for its SHA-256 to be computed when first asked
// (Statuses): hashing on the start's path cost 20-80 ms per binary (a real Envoy's 130 MB, far
// more), or nil when the process cannot be shown to run it.
func (s *Supervisor) launch(ctx context.Context, c *child, binary string, verified *openFile) (Instance, *openFile, error) {
	exe := verified
	if exe == nil {
		f, id, err := openBinary(binary)
		if err != nil {
			return nil, nil, err
		}
		exe = &openFile{f, id}
	}
	inst, err := c.Launch(proc.WithState(proc.WithExecutable(ctx, exe.f), c.state), binary, c.files)
	if err != nil {
		if verified == nil {
			exe.close()
		}
		return nil, nil, err
	}
	err = runs(inst.Pid(), exe.f, exe.id)
	switch {
	case err != nil && verified != nil:
		s.stop(c, inst)
		return nil, nil, fmt.Errorf("pid %d stopped: it may not run the verified %s: %w", inst.Pid(), binary, err)
	case err != nil:
		c.log.Warn("started, but its binary's SHA-256 is unknown", "pid", inst.Pid(), "error", err)
		exe.close()
		exe = nil
	case verified != nil:
		exe = nil // the swap's caller owns it and knows its SHA-256
	}
	c.log.Info("started", "pid", inst.Pid())
	return inst, exe, nil
}

// runs checks that process pid executes the open file exe, still as it was (identity id).
func runs(pid int, exe *os.File, id fileID) error {
	if now, err := fileIdentity(exe); err != nil || !now.sameContent(id) {
		return fmt.Errorf("binary %s changed while it was started", exe.Name())
	}
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/exe", pid), &st); err != nil {
		return fmt.Errorf("check the executable of pid %d: %w", pid, err)
	}
	if st.Dev != id.dev || st.Ino != id.ino {
		return fmt.Errorf("pid %d runs another file than the %s that was opened (replaced meanwhile)", pid, exe.Name())
	}
	return nil
}

// waitReady polls inst until it is ready, it exits, or timeout.
func (s *Supervisor) waitReady(ctx context.Context, inst Instance, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var reason error // the last answer, not the deadline that cut the last question short
	for {
		cctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
		err := inst.Ready(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if reason == nil || !errors.Is(err, context.DeadlineExceeded) {
			reason = err
		}
		select {
		case <-inst.Exited():
			return fmt.Errorf("pid %d exited before it was ready: %v", inst.Pid(), inst.Err())
		case <-ctx.Done():
			return fmt.Errorf("pid %d not ready after %v: %v", inst.Pid(), timeout, reason)
		case <-tick.C:
		}
	}
}

// stop drains a process, then stops it, each within its deadline; a second SIGTERM (Kill)
// ends both deadlines at once.
func (s *Supervisor) stop(c *child, inst Instance) { s.stopWithin(c, inst, c.DrainTimeout) }

// stopWithin is stop with a drain deadline of drain: a hung process is asked to drain for as
// long as it had to answer a call, since it answers none.
func (s *Supervisor) stopWithin(c *child, inst Instance, drain time.Duration) {
	c.mu.Lock()
	current := c.inst == inst
	c.mu.Unlock()
	if current { // not a swap's new process that failed: that one never was the child's state
		s.setState(c, Draining)
	}
	c.log.Info("draining", "pid", inst.Pid())
	dctx, cancel := context.WithTimeout(s.hard, drain)
	if err := inst.Drain(dctx); err != nil {
		c.log.Warn("drain did not finish", "pid", inst.Pid(), "error", err)
	}
	cancel()
	sctx, cancel := context.WithTimeout(s.hard, s.opts.StopTimeout)
	defer cancel()
	inst.Stop(sctx)
	c.log.Info("stopped", "pid", inst.Pid())
	c.mu.Lock()
	if c.inst == inst {
		c.inst = nil
		c.status.Pid = 0
	}
	c.mu.Unlock()
}

// adopt makes inst the child's running process. Its binary's SHA-256 is sum, or, when sum is
// "", the one of exe, computed when first asked (Statuses).
func (s *Supervisor) adopt(c *child, inst Instance, binary, sum string, exe *openFile) {
	c.mu.Lock()
	c.exe.close()
	c.exe = exe
	c.inst, c.lastErr = inst, nil
	c.status.Pid = inst.Pid()
	c.status.Binary = binary
	c.status.SHA256 = sum
	c.status.StartedAt = time.Now().UTC()
	c.mu.Unlock()
	s.setState(c, Running)
}

func (s *Supervisor) countRestart(c *child) {
	c.mu.Lock()
	c.status.Restarts++
	c.mu.Unlock()
	s.restarts.WithLabelValues(c.Name).Inc()
}
