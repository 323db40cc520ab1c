// Package running counts calls in progress, so that what they use is
// closed only after the last of them has returned.
package running

import (
	"context"
	"net/http"
	"sync"
)

// Group counts the calls in progress. Unlike a sync.WaitGroup, a call may
// begin while Wait waits (a call already counted can start another), and
// Wait gives up when its context ends. The zero value is ready to use.
type Group struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to zero; nil while n is zero
}

// Begin counts one call in progress; the func it returns ends it, once.
func (g *Group) Begin() (end func()) {
	g.begin()
	var once sync.Once
	return func() { once.Do(g.end) }
}

func (g *Group) begin() {
	g.mu.Lock()
	if g.n == 0 {
		g.idle = make(chan struct{})
	}
	g.n++
	g.mu.Unlock()
}

func (g *Group) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.n == 0 {
		close(g.idle)
		g.idle = nil
	}
}

// Go runs f in a goroutine of its own, counted until it returns.
func (g *Group) Go(f func()) {
	end := g.Begin()
	go func() {
		defer end()
		f()
	}()
}

// Handler counts each request h serves until h returns.
func (g *Group) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.begin() // no closure per request: the broker's public path
		defer g.end()
		h.ServeHTTP(w, r)
	})
}

// Wait waits until no call is in progress or ctx ends, and returns how
// many calls were still in progress then (0 when it did not give up).
func (g *Group) Wait(ctx context.Context) int {
	for {
		g.mu.Lock()
		n, idle := g.n, g.idle
		g.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-idle:
			// Another call may have begun since: look again.
		case <-ctx.Done():
			g.mu.Lock()
			defer g.mu.Unlock()
			return g.n
		}
	}
}
