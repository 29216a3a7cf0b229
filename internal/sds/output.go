package sds

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// OUTPUT_CERTS file names, as Istio's.
const (
	outputKey   = "key.pem"
	outputChain = "cert-chain.pem"
	outputRoot  = "root-cert.pem"
)

// output writes the workload key, chain and roots into a directory (OUTPUT_CERTS) on every
// change: each file atomically (temp file + rename), only when its content changed. A write
// that fails (a full disk, a read-only mount) is tried again with backoff until it succeeds
// or newer content replaces it (run): a proxyless client waiting for these files gets them
// as soon as the disk allows, not at the next rotation.
type output struct {
	dir      string // "" writes nothing
	mode     os.FileMode
	failures prometheus.Counter

	mu    sync.Mutex
	want  *outputFiles // content not written yet
	retry chan struct{}
}

type outputFiles struct{ chain, key, roots []byte }

// newOutput returns the OUTPUT_CERTS writer of dir; its failed writes are counted on reg
// (agentd_output_certs_write_failures_total), when reg is not nil.
func newOutput(dir string, mode os.FileMode, reg prometheus.Registerer) *output {
	o := &output{dir: dir, mode: mode, retry: make(chan struct{}, 1),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentd_output_certs_write_failures_total",
			Help: "Writes of the OUTPUT_CERTS files that failed (each is tried again with backoff).",
		})}
	if reg != nil && dir != "" {
		reg.MustRegister(o.failures)
	}
	return o
}

// write writes the files, or leaves them to run to write later if it fails.
func (o *output) write(chain, key, roots []byte) error {
	if o == nil || o.dir == "" {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.want = &outputFiles{chain, key, roots}
	return o.flush()
}

// run tries the failed writes again, with backoff, until ctx ends.
func (o *output) run(ctx context.Context, log hclog.Logger) {
	if o == nil || o.dir == "" {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.retry:
		}
		for wait := retryInitial; ; wait = min(2*wait, retryMax) {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			o.mu.Lock()
			err := o.flush()
			pending := o.want != nil
			o.mu.Unlock()
			if !pending {
				log.Info("OUTPUT_CERTS written after earlier failures", "dir", o.dir)
				break
			}
			log.Warn("writing OUTPUT_CERTS failed again", "error", err, "retry_in", min(2*wait, retryMax))
		}
	}
}

// flush writes o.want; o.mu is held. A failure is counted and leaves o.want for run.
func (o *output) flush() error {
	if o.want == nil {
		return nil
	}
	if err := o.writeFiles(o.want); err != nil {
		o.failures.Inc()
		select {
		case o.retry <- struct{}{}:
		default:
		}
		return err
	}
	o.want = nil
	return nil
}

func (o *output) writeFiles(w *outputFiles) error {
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return fmt.Errorf("create OUTPUT_CERTS directory: %w", err)
	}
	// The roots, then the key, the chain last: a reader that reloads when the chain changes
	// never sees a new chain with an old key or roots.
	for _, f := range []struct {
		name string
		b    []byte
	}{{outputRoot, w.roots}, {outputKey, w.key}, {outputChain, w.chain}} {
		if len(f.b) == 0 {
			continue
		}
		if err := o.writeFile(filepath.Join(o.dir, f.name), f.b); err != nil {
			return err
		}
	}
	return nil
}

func (o *output) writeFile(path string, b []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	mode := o.mode
	if mode == 0 {
		mode = 0o600
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
