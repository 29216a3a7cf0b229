package supervisor

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// State is where a child is in its life.
type State string

const (
	Starting  State = "starting"
	Running   State = "running"
	Backoff   State = "backoff"   // waiting to restart after an exit
	CrashLoop State = "crashloop" // still restarted, but it keeps exiting
	Draining  State = "draining"
	Stopped   State = "stopped"
)

var states = []State{Starting, Running, Backoff, CrashLoop, Draining, Stopped}

// Options tune the supervisor. The zero value works.
type Options struct {
	Log hclog.Logger
	// Root is the directory relative Unix socket paths are under (default: working directory).
	Root string
	// Inherited holds sockets agentd itself was handed (systemd socket activation), by name;
	// they are used instead of opening new ones.
	Inherited map[string]*os.File
	// Metrics registers the children's states and restarts (default: not registered).
	Metrics prometheus.Registerer

	ReadyTimeout time.Duration // for a new process to become ready (default DefaultReadyTimeout)
	DrainTimeout time.Duration // for a process to drain when stopped (default DefaultDrainTimeout)
	StopTimeout  time.Duration // for a drained process to exit before SIGKILL (default DefaultStopTimeout)
	Backoff      BackoffPolicy

	// CallTimeout bounds each Ready and Metrics call to a process (default DefaultCallTimeout):
	// readiness and the merged metrics never wait longer on a hung one.
	CallTimeout time.Duration
	// HealthInterval is how often each running process is asked whether it is ready (default
	// DefaultHealthInterval); one that misses HungAfter of these calls in a row (default 3)
	// is hung: it is drained, killed and started again, as a restart command does.
	HealthInterval time.Duration
	HungAfter      int
}

// Defaults of Options' timeouts.
const (
	DefaultReadyTimeout   = 30 * time.Second
	DefaultDrainTimeout   = 5 * time.Second
	DefaultStopTimeout    = 5 * time.Second
	DefaultCallTimeout    = 2 * time.Second
	DefaultHealthInterval = 5 * time.Second
)

// BackoffPolicy is how soon a child that exited is started again.
type BackoffPolicy struct {
	Initial        time.Duration // delay after the second exit in a row (default 50 ms); the first is restarted at once
	Max            time.Duration // cap (default 30 s)
	StableAfter    time.Duration // a run this long resets the delay (default 10 s)
	CrashLoopAfter int           // exits in a row, each before StableAfter, that make a crash loop (default 5)
	// MaxQueued caps the delay of a child that serves sockets (default 2 s): its clients wait
	// in the sockets' queues meanwhile, and a DNS resolver waits 5 s for an answer (glibc's
	// default), so a longer delay turns queued queries into lost ones.
	MaxQueued time.Duration
}

// delay is the wait before restart number n (1-based) of a run of failures: none for the first
// (a helper that was fine and crashed once is back at once), then exponential from Initial,
// capped, with ±20% jitter so that children failing together do not restart in lockstep.
func (b BackoffPolicy) delay(n int) time.Duration { return b.delayFor(n, false) }

// delayFor is delay, capped by MaxQueued when clients are queued on the child's sockets.
func (b BackoffPolicy) delayFor(n int, queued bool) time.Duration {
	if n <= 1 {
		return 0
	}
	d := b.Initial
	for i := 2; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if queued {
		d = min(d, b.MaxQueued)
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

func (o *Options) setDefaults() {
	if o.Log == nil {
		o.Log = hclog.NewNullLogger()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.ReadyTimeout, DefaultReadyTimeout)
	def(&o.DrainTimeout, DefaultDrainTimeout)
	def(&o.StopTimeout, DefaultStopTimeout)
	def(&o.CallTimeout, DefaultCallTimeout)
	def(&o.HealthInterval, DefaultHealthInterval)
	if o.HungAfter == 0 {
		o.HungAfter = 3
	}
	def(&o.Backoff.Initial, 50*time.Millisecond)
	def(&o.Backoff.Max, 30*time.Second)
	def(&o.Backoff.StableAfter, 10*time.Second)
	def(&o.Backoff.MaxQueued, 2*time.Second)
	if o.Backoff.CrashLoopAfter == 0 {
		o.Backoff.CrashLoopAfter = 5
	}
}

// Status is a child's state as `agentd status --json` shows it.
type Status struct {
	Name      string    `json:"name"`
	Pid       int       `json:"pid"`
	State     State     `json:"state"`
	Restarts  int       `json:"restarts"`
	Binary    string    `json:"binary"`
	SHA256    string    `json:"sha256"`
	StartedAt time.Time `json:"started_at"`
}

// Supervisor runs the children.
type Supervisor struct {
	opts     Options
	children []*child
	byName   map[string]*child

	restarts *prometheus.CounterVec
	state    *prometheus.GaugeVec
	missed   *prometheus.CounterVec
	hashes   binaryHashes

	// hard ends every drain and stop deadline at once: a second SIGTERM.
	hard     context.Context
	hardStop context.CancelFunc
}

type child struct {
	Child
	log   hclog.Logger
	files []*os.File
	state *os.File // memory that outlives the child's processes (proc.WithState)
	cmds  chan command

	mu       sync.Mutex
	status   Status
	inst     Instance
	lastErr  error
	failures int       // exits in a row without a stable run
	answered Instance  // the last process that answered a Ready call (see watchHealth)
	exe      *openFile // the running process's binary, until its SHA-256 is known (Statuses)
}

// New returns a supervisor for children, which start in that order.
func New(children []Child, opts Options) (*Supervisor, error) {
	opts.setDefaults()
	hard, hardStop := context.WithCancel(context.Background())
	s := &Supervisor{
		opts:     opts,
		byName:   map[string]*child{},
		hard:     hard,
		hardStop: hardStop,
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentd_child_restarts_total", Help: "Times a child process was started again.",
		}, []string{"child"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentd_child_state", Help: "1 for the state each child is in, 0 for the others.",
		}, []string{"child", "state"}),
		missed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentd_child_calls_missed_total", Help: "Calls to a child (ready, metrics, health) that got no answer in time.",
		}, []string{"child", "call"}),
	}
	if opts.Metrics != nil {
		for _, c := range []prometheus.Collector{s.restarts, s.state, s.missed} {
			if err := opts.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("register supervisor metrics: %w", err)
			}
		}
	}
	for _, spec := range children {
		spec.ReadyTimeout = cmp.Or(spec.ReadyTimeout, opts.ReadyTimeout)
		spec.DrainTimeout = cmp.Or(spec.DrainTimeout, opts.DrainTimeout)
		if _, dup := s.byName[spec.Name]; dup {
			return nil, fmt.Errorf("two children named %q", spec.Name)
		}
		c := &child{
			Child:  spec,
			log:    opts.Log.Named(spec.Name),
			cmds:   make(chan command),
			status: Status{Name: spec.Name, State: Stopped, Binary: spec.Binary},
		}
		s.children = append(s.children, c)
		s.byName[spec.Name] = c
		s.restarts.WithLabelValues(spec.Name)
		s.setState(c, Stopped)
	}
	return s, nil
}

// Run opens the children's sockets, starts the children side by side, keeps them running
// until ctx ends, then stops them in reverse order and closes the sockets. The children need
// not wait for each other: their sockets are the parent's, so a client that reaches one before
// it serves (Envoy dialling xds-proxy) waits in the socket's queue rather than failing.
func (s *Supervisor) Run(ctx context.Context) error {
	defer s.hardStop()
	if err := s.openSockets(); err != nil {
		return err
	}
	defer s.closeSockets()

	stops := make([]func(), len(s.children))
	for i, c := range s.children {
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.loop(cctx, c)
		}()
		go s.awaitReady(ctx, c)
		stops[i] = func() { cancel(); <-done }
	}
	<-ctx.Done()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
	return nil
}

// StopBudget is the longest a stop can take: the children drain and stop one after the
// other, each within its drain and stop deadlines.
func (s *Supervisor) StopBudget() time.Duration {
	var d time.Duration
	for _, c := range s.children {
		d += c.DrainTimeout + s.opts.StopTimeout
	}
	return d
}

// awaitReady logs c's first readiness, or that it was not ready within its ReadyTimeout (Ready
// goes on reporting it).
func (s *Supervisor) awaitReady(ctx context.Context, c *child) {
	ctx, cancel := context.WithTimeout(ctx, c.ReadyTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c.mu.Lock()
		inst := c.inst
		c.mu.Unlock()
		if inst != nil && s.ready(ctx, c, inst, "ready") == nil {
			c.log.Info("ready", "pid", inst.Pid())
			return
		}
		select {
		case <-ctx.Done():
			if err := s.childReady(context.WithoutCancel(ctx), c); err != nil {
				c.log.Warn("not ready within its start deadline", "timeout", c.ReadyTimeout, "reason", err)
			}
			return
		case <-tick.C:
		}
	}
}

// Kill makes every drain and stop deadline pass now: the children still running are killed.
func (s *Supervisor) Kill() { s.hardStop() }

// Statuses returns every child's status, in start order.
func (s *Supervisor) Statuses() []Status {
	out := make([]Status, 0, len(s.children))
	for _, c := range s.children {
		s.hashRunning(c)
		c.mu.Lock()
		out = append(out, c.status)
		c.mu.Unlock()
	}
	return out
}

// Ready returns nil when every child runs and says it is ready, or the first reason not, in
// the children's order. The children are asked side by side, each within CallTimeout.
func (s *Supervisor) Ready(ctx context.Context) error {
	errs := make([]error, len(s.children))
	var wg sync.WaitGroup
	for i, c := range s.children {
		wg.Go(func() { errs[i] = s.childReady(ctx, c) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *Supervisor) childReady(ctx context.Context, c *child) error {
	c.mu.Lock()
	inst, st, lastErr := c.inst, c.status.State, c.lastErr
	c.mu.Unlock()
	if inst == nil || st != Running {
		if lastErr != nil {
			return fmt.Errorf("%s is %s: %v", c.Name, st, lastErr)
		}
		return fmt.Errorf("%s is %s", c.Name, st)
	}
	if err := s.ready(ctx, c, inst, "ready"); err != nil {
		return fmt.Errorf("%s is not ready: %w", c.Name, err)
	}
	return nil
}

// errNoAnswer is a call to a child that got no answer within CallTimeout.
var errNoAnswer = errors.New("no answer")

// ready asks inst whether it is ready, within CallTimeout; a call cut short by that deadline
// (not by ctx) is a missed call, counted under call.
func (s *Supervisor) ready(ctx context.Context, c *child, inst Instance, call string) error {
	cctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	defer cancel()
	err := s.missedCall(ctx, cctx, c, inst, call, inst.Ready(cctx))
	if ctx.Err() == nil && !errors.Is(err, errNoAnswer) {
		c.mu.Lock()
		c.answered = inst
		c.mu.Unlock()
	}
	return err
}

// missedCall turns err, the result of a call made with cctx (ctx with CallTimeout), into
// errNoAnswer when CallTimeout cut the call short, and counts it.
func (s *Supervisor) missedCall(ctx, cctx context.Context, c *child, inst Instance, call string, err error) error {
	if err == nil || ctx.Err() != nil || cctx.Err() == nil {
		return err
	}
	s.missed.WithLabelValues(c.Name, call).Inc()
	return fmt.Errorf("%w within %v (pid %d hung?)", errNoAnswer, s.opts.CallTimeout, inst.Pid())
}

// Metrics returns the metrics of each running child, by name; a child that cannot answer, or
// not within CallTimeout, is left out and its error returned beside. The children are asked
// side by side.
func (s *Supervisor) Metrics(ctx context.Context) (map[string][]byte, map[string]error) {
	texts, errs := map[string][]byte{}, map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range s.children {
		c.mu.Lock()
		inst := c.inst
		c.mu.Unlock()
		if inst == nil {
			errs[c.Name] = fmt.Errorf("%s is not running", c.Name)
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
			defer cancel()
			text, err := inst.Metrics(cctx)
			err = s.missedCall(ctx, cctx, c, inst, "metrics", err)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[c.Name] = fmt.Errorf("metrics of %s: %w", c.Name, err)
				return
			}
			texts[c.Name] = text
		})
	}
	wg.Wait()
	return texts, errs
}

// ErrUnknownChild is returned for a name that is not a child.
var ErrUnknownChild = errors.New("no such child")

// Restart stops the child's process gracefully and starts a new one at once.
func (s *Supervisor) Restart(ctx context.Context, name string) error {
	return s.send(ctx, name, command{kind: cmdRestart})
}

// Swap starts binary beside the child's running process on the same sockets, waits until it
// is ready (within timeout, or ReadyTimeout), then drains and stops the old process; later
// restarts use binary. If wantSHA256 is set and binary's does not match, nothing changes. If the
// new process does not become ready, it is stopped and the old one keeps serving.
//
// binary must be an absolute path: agentd's working directory is not the caller's. The process
// started runs the very file that was hashed (see launch): a file renamed over binary in the
// meantime is not run, and the SHA-256 recorded is the one of the running file.
func (s *Supervisor) Swap(ctx context.Context, name, binary, wantSHA256 string, timeout time.Duration) error {
	if !filepath.IsAbs(binary) {
		return fmt.Errorf("binary %q is a relative path: give an absolute one (not swapped)", binary)
	}
	// The file is opened once: the one hashed is the one started (launch).
	exe, id, err := openBinary(binary)
	if err != nil {
		return err
	}
	defer exe.Close()
	sum, err := s.hashes.fileSum(exe, id)
	if err != nil {
		return err
	}
	if wantSHA256 != "" && sum != wantSHA256 {
		return fmt.Errorf("checksum of %s is %s, want %s: not swapped", binary, sum, wantSHA256)
	}
	if c, ok := s.byName[name]; ok && timeout == 0 {
		timeout = c.ReadyTimeout
	}
	return s.send(ctx, name, command{kind: cmdSwap, binary: binary, exe: &openFile{exe, id}, sha256: sum, timeout: timeout})
}

func (s *Supervisor) send(ctx context.Context, name string, cmd command) error {
	c, ok := s.byName[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownChild, name)
	}
	cmd.reply = make(chan error, 1)
	select {
	case c.cmds <- cmd:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-cmd.reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

type cmdKind int

const (
	cmdRestart cmdKind = iota
	cmdSwap
)

type command struct {
	kind    cmdKind
	binary  string
	exe     *openFile // binary, opened and hashed
	sha256  string    // exe's
	timeout time.Duration
	reply   chan error
}

// binaryHashes remembers the SHA-256 of the binaries already read, by file identity: every
// helper of a links layout is agentd's own binary, hashed once (when `agentd status` first
// asks) instead of once per process (about 20 ms each). A file replaced or rewritten in place
// has another identity.
type binaryHashes struct {
	mu   sync.Mutex
	sums map[fileID]string
}

type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
}

func identity(st *syscall.Stat_t) fileID {
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// sameContent tells whether a file is still the one it was, as far as its bytes go: its
// ctime also moves when a new file is renamed over its path, which leaves it as it was.
func (id fileID) sameContent(then fileID) bool {
	id.ctime = then.ctime
	return id == then
}

// fileIdentity is the identity of an open file.
func fileIdentity(f *os.File) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return fileID{}, fmt.Errorf("stat binary %s: %w", f.Name(), err)
	}
	return identity(&st), nil
}

// sum hashes the binary at path.
func (h *binaryHashes) sum(path string) (string, error) {
	f, id, err := openBinary(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return h.fileSum(f, id)
}

// openFile is an open binary and its identity when it was opened.
type openFile struct {
	f  *os.File
	id fileID
}

// close closes f; a nil openFile is nothing to close.
func (o *openFile) close() {
	if o != nil {
		_ = o.f.Close()
	}
}

// hashRunning computes the SHA-256 of the binary c's process runs, if not known yet. The
// file is taken from c while it is read, so that a new process adopted meanwhile neither
// closes it under the read nor gets its sum.
func (s *Supervisor) hashRunning(c *child) {
	c.mu.Lock()
	exe, inst := c.exe, c.inst
	c.exe = nil
	c.mu.Unlock()
	if exe == nil {
		return
	}
	defer exe.close()
	sum, err := s.hashes.fileSum(exe.f, exe.id)
	if err != nil {
		c.log.Warn("the SHA-256 of the running binary is unknown", "error", err)
		return
	}
	c.mu.Lock()
	if c.inst == inst && c.status.SHA256 == "" {
		c.status.SHA256 = sum
	}
	c.mu.Unlock()
}

// openBinary opens a binary to hash it and run that same open file.
func openBinary(path string) (*os.File, fileID, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fileID{}, fmt.Errorf("read binary: %w", err)
	}
	id, err := fileIdentity(f)
	if err != nil {
		f.Close()
		return nil, fileID{}, err
	}
	return f, id, nil
}

// fileSum is the SHA-256 of the open file f, whose identity was id when it was opened. It
// reads at offsets, leaving f's own offset alone.
func (h *binaryHashes) fileSum(f *os.File, id fileID) (string, error) {
	// Held while hashing: the helpers starting side by side from one binary wait for its
	// one hash instead of each computing it.
	h.mu.Lock()
	defer h.mu.Unlock()
	if sum, ok := h.sums[id]; ok {
		return sum, nil
	}
	d := sha256.New()
	if _, err := io.Copy(d, io.NewSectionReader(f, 0, id.size)); err != nil {
		return "", fmt.Errorf("read binary %s: %w", f.Name(), err)
	}
	if now, err := fileIdentity(f); err != nil || !now.sameContent(id) {
		return "", fmt.Errorf("binary %s changed while it was read", f.Name())
	}
	if h.sums == nil {
		h.sums = map[fileID]string{}
	}
	h.sums[id] = hex.EncodeToString(d.Sum(nil))
	return h.sums[id], nil
}

func (s *Supervisor) setState(c *child, st State) {
	c.mu.Lock()
	c.status.State = st
	c.mu.Unlock()
	for _, x := range states {
		v := 0.0
		if x == st {
			v = 1
		}
		s.state.WithLabelValues(c.Name, string(x)).Set(v)
	}
}
