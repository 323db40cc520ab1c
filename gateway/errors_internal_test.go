package gateway

import (
	"testing"
	"time"

	"github.com/sandgate/sandgate/httpapi"
)

func TestRetryAfterSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{
		{time.Nanosecond, 1},
		{time.Second, 1},
		{time.Second + time.Millisecond, 2},
		{1900 * time.Millisecond, 2},
		{100 * time.Second, 100},
	} {
		if got := httpapi.RetryAfterSeconds(c.d); got != c.want {
			t.Errorf("retryAfterSeconds(%v) = %d; want %d", c.d, got, c.want)
		}
	}
}
