package tick_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/tick"
)

func TestEveryStopsWhenFReturnsFalse(t *testing.T) {
	n := 0
	tick.Every(context.Background(), time.Millisecond, func() bool {
		n++
		return n < 3
	})
	if n != 3 {
		t.Fatalf("f ran %d times; want 3", n)
	}
}

func TestEveryStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tick.Every(ctx, time.Hour, func() bool {
		t.Error("f ran after its context ended")
		return true
	})
}

func TestNowAndEveryCallsFirstAtOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	tick.NowAndEvery(ctx, time.Hour, func() {
		n++
		cancel()
	})
	if n != 1 {
		t.Fatalf("f ran %d times; want 1, at once", n)
	}
}

func TestSleep(t *testing.T) {
	if err := tick.Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep of a live context = %v; want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tick.Sleep(ctx, time.Hour); err != context.Canceled {
		t.Errorf("Sleep of an ended context = %v; want context.Canceled", err)
	}
	if err := tick.Sleep(ctx, 0); err != context.Canceled {
		t.Errorf("Sleep(0) of an ended context = %v; want context.Canceled", err)
	}
}
