package images

import (
	"context"
	"sync"
)

// flight runs one call per key at a time and hands its result to every
// caller that asked while it ran: the single-flight that makes concurrent
// pulls of one image fetch it once.
type flight[T any] struct {
	mu    sync.Mutex
	calls map[string]*flightCall[T]
}

type flightCall[T any] struct {
	done chan struct{}
	val  T
	err  error
}

// do runs fn for key unless a call for key is already running, in which case
// it waits for that call's result. fn runs on its own goroutine so that a
// caller whose ctx ends does not fail the others; it must bound itself.
func (f *flight[T]) do(ctx context.Context, key string, fn func() (T, error)) (T, error) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = make(map[string]*flightCall[T])
	}
	c, ok := f.calls[key]
	if !ok {
		c = &flightCall[T]{done: make(chan struct{})}
		f.calls[key] = c
		go func() {
			c.val, c.err = fn()
			f.mu.Lock()
			delete(f.calls, key)
			f.mu.Unlock()
			close(c.done)
		}()
	}
	f.mu.Unlock()
	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}
