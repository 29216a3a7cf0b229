// Package logbuf is a buffer safe for concurrent writes: the sink tests give a logger or a
// child process, and read while it is written.
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer collects writes; its zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
