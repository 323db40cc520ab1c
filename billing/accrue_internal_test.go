package billing

import (
	"math/rand/v2"
	"testing"
	"time"
)

// However a workspace's time is cut, its periods' seconds add up to its
// metered seconds, the accrued periods are exactly the settled ones, and
// only the last is final.
func TestPeriodsAddUp(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2026, 1, 31, 20, 0, 0, 0, time.UTC)
	for range 2000 {
		start := base.Add(time.Duration(r.Int64N(int64(6 * time.Hour))))
		end := start.Add(time.Duration(r.Int64N(int64(30 * time.Hour))))
		ps := periods("ws", start, end, time.Time{})
		var sum int64
		for i, p := range ps {
			sum += p.secs
			if p.final != (i == len(ps)-1) || p.secs < 0 {
				t.Fatalf("periods(%v, %v)[%d] = %+v", start, end, i, p)
			}
			if i > 0 && !p.from.Equal(ps[i-1].to) {
				t.Fatalf("periods(%v, %v): gap before %d", start, end, i)
			}
		}
		if want := MeteredSeconds(start, end); sum != want {
			t.Fatalf("periods(%v, %v) add up to %d s; want %d", start, end, sum, want)
		}
		limit := start.Add(time.Duration(r.Int64N(int64(end.Sub(start) + 1))))
		acc := periods("ws", start, limit, limit)
		for i, p := range acc {
			if p != ps[i] {
				t.Fatalf("accrued period %d = %+v; settled %+v", i, p, ps[i])
			}
		}
	}
}
