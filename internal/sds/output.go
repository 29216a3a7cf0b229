package sds

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// OUTPUT_CERTS file names, as Istio's.
const (
	outputKey   = "key.pem"
	outputChain = "cert-chain.pem"
	outputRoot  = "root-cert.pem"
)

// output writes the workload key, chain and roots into a directory (OUTPUT_CERTS) on every
// change: each file atomically (temp file + rename), only when its content changed.
type output struct {
	dir  string // "" writes nothing
	mode os.FileMode
	mu   sync.Mutex
}

func (o *output) write(chain, key, roots []byte) error {
	if o == nil || o.dir == "" {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return fmt.Errorf("create OUTPUT_CERTS directory: %w", err)
	}
	// The roots, then the key, the chain last: a reader that reloads when the chain changes
	// never sees a new chain with an old key or roots.
	for _, f := range []struct {
		name string
		b    []byte
	}{{outputRoot, roots}, {outputKey, key}, {outputChain, chain}} {
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
