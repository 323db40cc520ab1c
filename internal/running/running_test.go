package running

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

func TestWaitNone(t *testing.T) {
	var g Group
	if n := g.Wait(t.Context()); n != 0 {
		t.Fatalf("Wait with nothing running = %d; want 0", n)
	}
}

// TestWaitFollowsNestedCalls: a call that starts another just before it
// returns keeps Wait waiting for the second.
func TestWaitFollowsNestedCalls(t *testing.T) {
	var g Group
	release := make(chan struct{})
	secondDone := make(chan struct{})
	g.Go(func() {
		<-release
		g.Go(func() {
			time.Sleep(20 * time.Millisecond)
			close(secondDone)
		})
	})
	waited := make(chan int)
	go func() { waited <- g.Wait(context.Background()) }()
	select {
	case n := <-waited:
		t.Fatalf("Wait returned %d while a call was running", n)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if n := <-waited; n != 0 {
		t.Fatalf("Wait = %d; want 0", n)
	}
	select {
	case <-secondDone:
	default:
		t.Fatal("Wait returned before the nested call had ended")
	}
}

// TestWaitGivesUp: Wait returns at its context's end with the calls still
// running; ending a call twice counts once.
func TestWaitGivesUp(t *testing.T) {
	var g Group
	end1, end2 := g.Begin(), g.Begin()
	end1()
	end1()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if n := g.Wait(ctx); n != 1 {
		t.Fatalf("Wait past its context = %d; want 1", n)
	}
	end2()
	if n := g.Wait(context.Background()); n != 0 {
		t.Fatalf("Wait after the last end = %d; want 0", n)
	}
}

func TestHandlerCountsRequests(t *testing.T) {
	var g Group
	in, out := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(g.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(in)
		<-out
	})))
	defer srv.Close()
	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-in
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if n := g.Wait(ctx); n != 1 {
		t.Fatalf("Wait during a request = %d; want 1", n)
	}
	close(out)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := g.Wait(context.Background()); n != 0 {
		t.Fatalf("Wait after the request = %d; want 0", n)
	}
}

// TestBeginWhileWaiting: calls that begin and end while Wait waits, the
// count crossing zero again and again (where a sync.WaitGroup panics), end
// with Wait returning 0 once the last has ended.
func TestBeginWhileWaiting(t *testing.T) {
	var g Group
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				g.Go(func() {})
			}
		})
	}
	for range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		g.Wait(ctx)
		cancel()
	}
	close(stop)
	wg.Wait()
	if n := g.Wait(context.Background()); n != 0 {
		t.Fatalf("Wait after the last call = %d; want 0", n)
	}
}
