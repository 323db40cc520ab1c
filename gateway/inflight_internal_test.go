package gateway

import "testing"

// TestInflightGiveBack checks that a burst's memory is given back once,
// when the last request of a burst of at least releaseAbove bytes ends,
// and not after a small one.
func TestInflightGiveBack(t *testing.T) {
	f := newInflight(Config{InflightBytes: 4 * releaseAbove})
	calls := make(chan struct{}, 10)
	f.giveBack = func() { calls <- struct{}{} }

	small, err := f.acquire(tenant{"ws_a", "inst_a", "acct_a"}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	small()
	a, err := f.acquire(tenant{"ws_a", "inst_a", "acct_a"}, releaseAbove/2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.acquire(tenant{"ws_b", "inst_a", "acct_a"}, releaseAbove/2)
	if err != nil {
		t.Fatal(err)
	}
	a()
	select {
	case <-calls:
		t.Fatal("memory given back while a transfer is still in flight")
	default:
	}
	b()
	<-calls // the burst reserved releaseAbove in all: given back once it ended
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.high != 0 {
		t.Errorf("burst high after the give-back = %d; want 0", f.high)
	}
	if len(calls) != 0 {
		t.Errorf("give-backs after one burst = %d; want 1", 1+len(calls))
	}
}
