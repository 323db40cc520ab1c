package local

import (
	"context"
	"sync"
	"time"
)

// The pool's refill is work no request waits for, and on a host of few
// CPUs it slows the requests it runs beside: a pooled workspace's mount
// namespace, bwrap and resident cost about as much CPU as a whole
// create-exec-release cycle of a client. So the refill waits for a gap
// between requests (refillGap with none in flight), as a client's own
// pauses give it, but never longer than refillMaxWait after the pool
// needed it, so that under steady load the pool still refills.

const (
	refillGap     = 2 * time.Millisecond
	refillMaxWait = 100 * time.Millisecond
)

// quiet counts a Provider's requests in flight (Create, Exec, Terminate,
// durable commands) and tells when they pause.
type quiet struct {
	mu   sync.Mutex
	n    int
	last time.Time     // when n last fell to 0
	idle chan struct{} // closed while n is 0
}

// enter marks a request in flight until the returned func is called.
func (q *quiet) enter() (leave func()) {
	q.mu.Lock()
	if q.n == 0 {
		q.idle = make(chan struct{})
	}
	q.n++
	q.mu.Unlock()
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.n--; q.n == 0 {
			q.last = time.Now()
			close(q.idle)
		}
	}
}

// wait returns once no request has been in flight for gap, or once max
// has passed, or ctx has ended.
func (q *quiet) wait(ctx context.Context, gap, max time.Duration) {
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	for {
		q.mu.Lock()
		n, last, idle := q.n, q.last, q.idle
		q.mu.Unlock()
		var t *time.Timer
		var wake <-chan time.Time
		if n == 0 {
			left := gap - time.Since(last)
			if left <= 0 {
				return
			}
			t = time.NewTimer(left)
			wake, idle = t.C, nil // until then, unless a request comes
		}
		select {
		case <-ctx.Done():
		case <-deadline.C:
		case <-idle: // the last request in flight ended: wait out the gap
			continue
		case <-wake:
			continue // the gap passed, unless a request came meanwhile
		}
		if t != nil {
			t.Stop()
		}
		return
	}
}
