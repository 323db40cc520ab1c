// Package tally runs one call from many goroutines at once and counts how
// the calls ended, for tests of what must hold under contention (a quota,
// a claim that only one caller wins).
package tally

import (
	"sync"
	"testing"
)

// Run calls f(i) for every i in [0, n) at once, each in its own
// goroutine, and returns how many returned nil (ok) and how many returned
// an error that refused reports as the expected refusal. Any other error
// fails tb, named by what.
func Run(tb testing.TB, n int, what string, f func(i int) error, refused func(error) bool) (ok, refusals int) {
	tb.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			err := f(i)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case refused(err):
				refusals++
			default:
				tb.Errorf("%s: %v", what, err)
			}
		})
	}
	wg.Wait()
	return ok, refusals
}
