package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sandgate/sandgate/store"
)

// TestAuditRange: entries come back oldest first across pages, a gateway
// whose clock is behind still appends (after the newest entry), and [from,
// to) is half-open. An entry sent twice (its reply lost, the command
// resent) is appended once.
func TestAuditRange(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		times := []time.Duration{0, time.Second, 2 * time.Second, time.Second /* behind */, 3 * time.Second, 3 * time.Second, 4 * time.Second}
		for i, d := range times {
			e := store.AuditEvent{Time: t0.Add(d), Actor: "alice:sgo_abcd", Action: fmt.Sprint("a", i), Outcome: store.AuditOutcome{Status: 200}}
			if err := db.AppendAudit(ctx, e, 400*24*time.Hour); err != nil {
				t.Fatalf("AppendAudit %d: %v", i, err)
			}
			if i == len(times)-1 {
				if err := db.AppendAudit(ctx, e, 400*24*time.Hour); err != nil {
					t.Fatalf("AppendAudit %d again: %v", i, err)
				}
			}
		}
		read := func(from, to time.Time, page int) []string {
			t.Helper()
			var out []string
			err := db.AuditRange(ctx, from, to, page, func(b []byte) error {
				var e store.AuditEvent
				if err := json.Unmarshal(b, &e); err != nil {
					return err
				}
				out = append(out, e.Action)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			return out
		}
		tests := []struct {
			name     string
			from, to time.Time
			want     string
		}{
			{"all", time.Time{}, time.Time{}, "[a0 a1 a2 a3 a4 a5 a6]"},
			{"from", t0.Add(3 * time.Second), time.Time{}, "[a4 a5 a6]"},
			{"to is excluded", t0.Add(time.Second), t0.Add(3 * time.Second), "[a1 a2 a3]"},
			{"empty", t0.Add(time.Hour), time.Time{}, "[]"},
		}
		for _, tt := range tests {
			for _, page := range []int{1, 2, 500} {
				t.Run(fmt.Sprint(tt.name, "/page", page), func(t *testing.T) {
					if got := fmt.Sprint(read(tt.from, tt.to, page)); got != tt.want {
						t.Errorf("AuditRange(%s) = %s; want %s", tt.name, got, tt.want)
					}
				})
			}
		}
	})
}

// TestAuditRetention: appending trims entries older than the retention.
func TestAuditRetention(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		// MINID ~ trims whole stream nodes (100 entries by default), so fill some.
		for i := range 250 {
			if err := db.AppendAudit(ctx, store.AuditEvent{Time: t0.Add(time.Duration(i) * time.Millisecond), Action: "old"}, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.AppendAudit(ctx, store.AuditEvent{Time: t0.Add(48 * time.Hour), Action: "new"}, time.Hour); err != nil {
			t.Fatal(err)
		}
		n, err := db.Redis().XLen(ctx, "sg:audit").Result()
		if err != nil {
			t.Fatal(err)
		}
		if n >= 251 || n < 1 {
			t.Errorf("entries after trimming = %d; want fewer than 251 (the old ones trimmed)", n)
		}
	})
}

// TestAppendAuditOnce: an event named once is appended once, however
// often it is written again and whatever was appended in between; other
// names still append, and a name older than the retention is forgotten
// with the log's entries.
func TestAppendAuditOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		const keep = time.Hour
		alert := store.AuditEvent{Time: t0, Actor: "sandgate", Action: "budget.alert", Outcome: store.AuditOutcome{Status: 200}}
		other := store.AuditEvent{Time: t0.Add(time.Second), Actor: "alice:sgo_abcd", Action: "pause", Outcome: store.AuditOutcome{Status: 200}}
		steps := []func() error{
			func() error { return db.AppendAuditOnce(ctx, alert, "alert-1", keep) },
			func() error { return db.AppendAudit(ctx, other, keep) },
			func() error { return db.AppendAuditOnce(ctx, alert, "alert-1", keep) }, // a retry after the other entry
			func() error { return db.AppendAuditOnce(ctx, alert, "alert-1", keep) },
			func() error { return db.AppendAuditOnce(ctx, alert, "alert-2", keep) },
		}
		for i, step := range steps {
			if err := step(); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		}
		if err := db.AppendAuditOnce(ctx, alert, "", keep); err == nil {
			t.Error("AppendAuditOnce without a name succeeded")
		}
		actions := func() []string {
			var out []string
			if err := db.AuditRange(ctx, time.Time{}, time.Time{}, 0, func(b []byte) error {
				var e store.AuditEvent
				if err := json.Unmarshal(b, &e); err != nil {
					return err
				}
				out = append(out, e.Action)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			return out
		}
		if got, want := fmt.Sprint(actions()), "[budget.alert pause budget.alert]"; got != want {
			t.Errorf("audit log = %s; want %s (alert-1 once, pause, alert-2)", got, want)
		}
		later := alert
		later.Time = t0.Add(48 * time.Hour)
		if err := db.AppendAuditOnce(ctx, later, "alert-3", keep); err != nil {
			t.Fatal(err)
		}
		if err := db.Redis().ZScore(ctx, "sg:audit:once{sg:audit}", "alert-1").Err(); err == nil {
			t.Error("alert-1's name is still kept 48 hours later, past the one-hour retention")
		}
		again := later
		again.Target = "account:acct_again"
		if err := db.AppendAuditOnce(ctx, again, "alert-1", keep); err != nil {
			t.Fatal(err)
		}
		n := 0
		if err := db.AuditRange(ctx, later.Time, time.Time{}, 0, func([]byte) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Errorf("entries 48 hours later = %d; want 2 (alert-3, and alert-1 whose name was forgotten)", n)
		}
	})
}
