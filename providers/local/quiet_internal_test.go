package local

import (
	"testing"
	"time"
)

// The refill's wait lets requests in flight pass and returns only once
// they have paused for the gap; max bounds it under steady load.
func TestQuietWait(t *testing.T) {
	var q quiet
	done := make(chan struct{})
	go func() {
		defer close(done)
		q.wait(t.Context(), time.Millisecond, time.Second) // none in flight yet
	}()
	<-done

	leave := q.enter()
	done = make(chan struct{})
	go func() {
		defer close(done)
		q.wait(t.Context(), time.Millisecond, time.Hour)
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("wait returned while a request was in flight")
	default:
	}
	before := time.Now()
	leave()
	<-done
	if waited := time.Since(before); waited < time.Millisecond {
		t.Errorf("wait returned %v after the request ended; want at least the 1ms gap", waited)
	}

	leave = q.enter()
	defer leave()
	done = make(chan struct{})
	go func() {
		defer close(done)
		q.wait(t.Context(), time.Millisecond, 20*time.Millisecond)
	}()
	<-done // steady load: max ends the wait
}
