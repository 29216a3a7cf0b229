package xdsproxy

import (
	"context"
	"testing"
	"time"
)

func TestQueueOrderAndNeverBlocks(t *testing.T) {
	q := newQueue[int]()
	const n = 100000 // far more than any channel buffer: put must not wait for get
	for i := range n {
		q.put(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n {
		v, ok := q.get(ctx)
		if !ok || v != i {
			t.Fatalf("get = %d, %v; want %d, true", v, ok, i)
		}
	}
	cancel()
	if _, ok := q.get(ctx); ok {
		t.Error("get on an empty queue after cancel = ok, want not ok")
	}
}

func TestQueueWakesWaiter(t *testing.T) {
	q := newQueue[string]()
	got := make(chan string)
	go func() {
		v, _ := q.get(context.Background())
		got <- v
	}()
	time.Sleep(10 * time.Millisecond) // let get wait; it must be woken, not miss the put
	q.put("x")
	if v := <-got; v != "x" {
		t.Errorf("get = %q, want x", v)
	}
}
