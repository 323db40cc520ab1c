package billing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
)

// BenchmarkExport exports a month of n synthetic ledger entries of one
// account, written straight into the stream with pipelined XADDs, and
// reports the process's peak RSS during the export (VmHWM, reset after the
// seeding): it stays flat from 100 000 to 1 000 000 rows. docs/benchmarks.md
// has the figures.
//
// SANDGATE_BENCH_REDIS=host:port uses that redis-server instead of a
// private one (so /usr/bin/time measures this process alone); entries
// already there are reused.
func BenchmarkExport(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		for _, f := range []billing.Format{billing.FormatCSV, billing.FormatJSONL} {
			b.Run(fmt.Sprintf("rows=%d/%s", n, f), func(b *testing.B) {
				ctx := context.Background()
				rdb := benchRedis(b)
				acct := fmt.Sprintf("acct_bench%d", n)
				seedBench(b, rdb, acct, n)
				l := billing.NewLedger(rdb)
				filter := billing.ExportFilter{From: month, To: month.AddDate(0, 1, 0)}
				runtime.GC()
				debug.FreeOSMemory()
				resetPeakRSS(b)
				b.ResetTimer()
				var rows int64
				for b.Loop() {
					st, err := billing.Export(ctx, l, []string{acct}, filter, f, io.Discard)
					if err != nil {
						b.Fatal(err)
					}
					rows = st.Rows
				}
				b.StopTimer()
				if rows != int64(n) {
					b.Fatalf("exported %d rows; want %d", rows, n)
				}
				rate := float64(rows) * float64(b.N) / b.Elapsed().Seconds()
				peak := peakRSSMB(b)
				// The floor, in the same run: a raw XRANGE of the same rows,
				// paged as the export pages them, decoding nothing.
				xr := xrangeRate(b, rdb, "sg:{"+acct+"}:usage", n)
				b.ReportMetric(rate, "rows/s")
				b.ReportMetric(xr, "xrange-rows/s")
				b.ReportMetric(rate/xr, "x-xrange")
				b.ReportMetric(peak, "peak-RSS-MB")
			})
		}
	}
}

// xrangeRate reads the n entries of key with XRANGE, 500 a page like
// Ledger.Scan, and returns entries per second.
func xrangeRate(b *testing.B, rdb *redis.Client, key string, n int) float64 {
	ctx := context.Background()
	start := time.Now()
	got, from := 0, "-"
	for {
		msgs, err := rdb.XRangeN(ctx, key, from, "+", 500).Result()
		if err != nil {
			b.Fatal(err)
		}
		got += len(msgs)
		if len(msgs) < 500 {
			break
		}
		from = "(" + msgs[len(msgs)-1].ID
	}
	if got != n {
		b.Fatalf("XRANGE read %d entries; want %d", got, n)
	}
	return float64(got) / time.Since(start).Seconds()
}

func benchRedis(b *testing.B) *redis.Client {
	if addr := os.Getenv("SANDGATE_BENCH_REDIS"); addr != "" {
		c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 30 * time.Second})
		b.Cleanup(func() { c.Close() })
		return c
	}
	return redistest.Start(b).Client()
}

// seedBench writes n entries terminated across the test month into acct's
// ledger, 10 000 XADDs per pipeline, unless it already holds n.
func seedBench(b *testing.B, rdb *redis.Client, acct string, n int) {
	ctx := context.Background()
	key := "sg:{" + acct + "}:usage"
	if have, _ := rdb.XLen(ctx, key).Result(); have == int64(n) {
		return
	}
	rdb.Del(ctx, key)
	step := month.AddDate(0, 1, 0).Sub(month) / time.Duration(n)
	sizes := []string{"small", "medium", "large"}
	prices := []int64{97, 389, 1_501}
	pipe := rdb.Pipeline()
	for i := range n {
		end := month.Add(time.Duration(i) * step).Truncate(time.Millisecond)
		s, secs := i%3, int64(1+i%7200)
		ws := "ws_" + strconv.FormatInt(int64(1e12+i), 36)
		e := billing.UsageEntry{ID: billing.FinalID(ws), Kind: billing.KindUsage, Final: true,
			AccountID: acct, InstanceID: "inst_bench" + strconv.Itoa(i%10), WorkspaceID: ws, Agent: "coder",
			RunID: "3f1e2d4c-0000-4000-8000-000000000000", Size: sizes[s], Image: "python:3.12", Provider: "local",
			RateCard: "standard", RateCardVersion: 1, Currency: "USD", UnitPriceMicros: prices[s], Seconds: secs,
			AmountMicros: prices[s] * secs, StartedAt: end.Add(-time.Duration(secs) * time.Second), EndedAt: end,
			TerminatedAt: end, TerminationReason: "released"}
		j, _ := json.Marshal(e)
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: fmt.Sprintf("%d-%d", end.UnixMilli(), i), Values: []string{"e", string(j)}})
		if pipe.Len() == 10_000 || i == n-1 {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// resetPeakRSS resets the kernel's peak RSS of this process (VmHWM).
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset peak RSS: %v", err)
	}
}

// peakRSSMB reads VmHWM of this process, in MB.
func peakRSSMB(b *testing.B) float64 {
	s, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}
