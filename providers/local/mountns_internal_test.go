package local

import (
	"os"
	"testing"
	"time"
)

// Closing a namespace's last descriptor unmounts its image, which takes
// the kernel milliseconds; the table's lock, which every exec and take
// needs, is not held meanwhile: a take's rekey of one workspace goes on
// while another's namespace is still being closed.
func TestNSCloseOutsideLock(t *testing.T) {
	closing, unblock := make(chan struct{}), make(chan struct{})
	tb := &nsTable{closeFD: func(f *os.File) {
		close(closing)
		<-unblock
		f.Close()
	}}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	close(ready)
	tb.m = map[string]*heldNS{
		"old":    {ref: "old", fd: f, ready: ready},
		"pooled": {ref: "pooled", ready: ready},
	}
	dropped := make(chan struct{})
	go func() {
		defer close(dropped)
		tb.drop("old")
	}()
	<-closing
	rekeyed := make(chan struct{})
	go func() {
		defer close(rekeyed)
		tb.rekey("pooled", "taken", func(o stepOptions) stepOptions { return o })
	}()
	select {
	case <-rekeyed:
	case <-time.After(10 * time.Second): // a deadlock guard, not a bound on speed
		t.Fatal("a take's rekey waited for another workspace's namespace to close")
	}
	close(unblock)
	<-dropped
	if _, ok := tb.m["taken"]; !ok || len(tb.m) != 1 {
		t.Errorf("table after the drop and the rekey: %v; want only taken", tb.m)
	}
}
