package billing_test

import (
	"testing"
	"time"

	"github.com/sandgate/sandgate/billing"
)

func TestParseAndFormatAmount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		out  string
	}{
		{"25", 25_000_000, "25.00"}, {"25.00", 25_000_000, "25.00"}, {"0.000100", 100, "0.0001"},
		{"-3.5", -3_500_000, "-3.50"}, {"0.1", 100_000, "0.10"}, {"1.000001", 1_000_001, "1.000001"},
	} {
		got, err := billing.ParseAmount(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseAmount(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
		if f := billing.FormatAmount(got); f != tc.out {
			t.Errorf("FormatAmount(%d) = %q, want %q", got, f, tc.out)
		}
	}
	for _, bad := range []string{"", ".5", "1.0000001", "1e3", "abc", "1.", "--1", "99999999999999999999"} {
		if _, err := billing.ParseAmount(bad); err == nil {
			t.Errorf("ParseAmount(%q) succeeded, want an error", bad)
		}
	}
}

func TestMeteredSecondsRoundsUp(t *testing.T) {
	s := time.Unix(100, 0)
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {time.Millisecond, 1}, {time.Second, 1}, {time.Second + 1, 2}, {-time.Second, 0}} {
		if got := billing.MeteredSeconds(s, s.Add(tc.d)); got != tc.want {
			t.Errorf("MeteredSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
	if got := billing.MeteredSeconds(time.Time{}, s); got != 0 {
		t.Errorf("MeteredSeconds(never started) = %d, want 0", got)
	}
	if _, err := billing.Amount(1<<62, 4); err == nil {
		t.Error("Amount overflow not refused")
	}
}
