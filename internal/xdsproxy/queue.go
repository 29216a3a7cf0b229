package xdsproxy

import (
	"context"
	"sync"
)

// queue is an unbounded FIFO. Requests towards the upstream go through one so that reading
// the client never waits on the upstream: with both directions bounded, the proxy and the
// control plane can each block in Send waiting for the other to read (Istio's issue 39209).
type queue[T any] struct {
	mu    sync.Mutex
	items []T
	ready chan struct{} // holds a token while items is not empty
}

func newQueue[T any]() *queue[T] {
	return &queue[T]{ready: make(chan struct{}, 1)}
}

// put appends v; it never blocks.
func (q *queue[T]) put(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// get removes the oldest item, waiting for one until ctx ends.
func (q *queue[T]) get(ctx context.Context) (T, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			v := q.items[0]
			var zero T
			q.items[0] = zero
			q.items = q.items[1:]
			if len(q.items) > 0 {
				select {
				case q.ready <- struct{}{}:
				default:
				}
			}
			q.mu.Unlock()
			return v, true
		}
		q.mu.Unlock()
		select {
		case <-q.ready:
		case <-ctx.Done():
			var zero T
			return zero, false
		}
	}
}
