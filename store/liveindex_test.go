package store_test

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

// readCounter is a redis.Hook counting the workspace records read
// (HGETALL, alone or in a pipeline) of keys that contain tag.
type readCounter struct {
	tag   string
	reads atomic.Int64
}

func (c *readCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *readCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c *readCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *readCounter) count(cmd redis.Cmder) {
	if strings.EqualFold(cmd.Name(), "hgetall") && strings.Contains(cmd.String(), c.tag) {
		c.reads.Add(1)
	}
}

// eachCountedDB is eachDB with the records read counted: one fresh client
// per DB, so that the hook sees every command of that DB.
func eachCountedDB(t *testing.T, fn func(t *testing.T, db *store.DB, rc *readCounter, acct string)) {
	t.Helper()
	redistest.Each(t, func(t *testing.T, rdb redis.UniversalClient) {
		acct := sandgate.NewID("acct_")
		rc := &readCounter{tag: "{" + acct + "}:ws:"}
		rdb.AddHook(rc)
		fn(t, store.New(store.Config{}, rdb), rc, acct)
	})
}

// unlimitedAdmission is the standard admission pipeline on db with risk
// limits no test reaches.
func unlimitedAdmission(db *store.DB) *admission.Pipeline {
	return admission.New(db.Redis(), admission.Standard(db, admission.StandardConfig{
		IdempotencyTTL: time.Hour, PendingTimeout: time.Minute,
		Risk: admission.RiskDefaults{AcquiresPerMinute: 1 << 20, MaxOpenWorkspaces: 1 << 20}})...)
}

// newStarting admits a workspace and leaves it starting (a create in
// flight, or one whose gateway died before confirming it). It returns the
// workspace and the hash of its Idempotency-Key.
func newStarting(t *testing.T, db *store.DB, acct, inst string, now time.Time) (sandgate.Workspace, string) {
	t.Helper()
	w := sandgate.Workspace{
		ID: sandgate.NewID(sandgate.PrefixWorkspace), AccountID: acct, InstanceID: inst,
		Label: "l", Size: "small", Image: "host", State: sandgate.WorkspaceStarting,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), IdleTimeout: time.Minute, LastActivity: now,
	}
	p := unlimitedAdmission(db)
	key := sandgate.NewID("k")
	if err := p.Admit(context.Background(), &admission.Request{Workspace: w, Scope: sandgate.Scope{Limits: sandgate.Limits{MaxConcurrentWorkspaces: 1 << 20}},
		Keys: store.AdmissionKeys(acct, inst, w.ID, key), KeyHash: key, RequestHash: "h", Now: now}); err != nil {
		t.Fatalf("Admit: %v", err)
	}
	return w, key
}

func ids(ws []sandgate.Workspace) []string {
	out := make([]string, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.ID)
	}
	slices.Sort(out)
	return out
}

func sorted(xs ...string) []string {
	out := slices.Clone(xs)
	slices.Sort(out)
	return out
}

// tenant records account acct and its instance inst, so that the walks of
// an account and of every account find them.
func tenant(t *testing.T, db *store.DB, acct, inst string, now time.Time) {
	t.Helper()
	if err := db.CreateAccount(context.Background(), sandgate.Account{ID: acct, Name: "a", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := db.PutInstance(context.Background(), sandgate.Instance{ID: inst, AccountID: acct, Name: "i", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
}

// terminated starts and records the end of w.
func terminated(t *testing.T, db *store.DB, w sandgate.Workspace, now time.Time) {
	t.Helper()
	if _, started, err := db.BeginTerminate(context.Background(), w, sandgate.ReasonReleased, now); err != nil || !started {
		t.Fatalf("BeginTerminate = %v, %v", started, err)
	}
	if err := db.FinishTerminate(context.Background(), w, now, store.Egress{}); err != nil {
		t.Fatalf("FinishTerminate: %v", err)
	}
}

// TestLiveWalkReadsOnlyLive: the walks of live workspaces (LiveWorkspaces
// for an instance, an account and every account; ListWorkspaces live)
// find exactly the workspaces not terminated (starting, running,
// terminating) and read no other record, however many ended before; a
// create that failed (Abort), or whose gateway died (FailCreate), stays
// found exactly while it is not terminated.
func TestLiveWalkReadsOnlyLive(t *testing.T) {
	eachCountedDB(t, func(t *testing.T, db *store.DB, rc *readCounter, acct string) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Second)
		inst := sandgate.NewID("inst_")
		tenant(t, db, acct, inst, now)
		for range 60 {
			terminated(t, db, newRunning(t, db, acct, inst, now), now)
		}
		run := newRunning(t, db, acct, inst, now)
		ending := newRunning(t, db, acct, inst, now)
		if _, started, err := db.BeginTerminate(ctx, ending, sandgate.ReasonReleased, now); err != nil || !started {
			t.Fatalf("BeginTerminate = %v, %v", started, err)
		}
		starting, _ := newStarting(t, db, acct, inst, now)
		crashed, _ := newStarting(t, db, acct, inst, now)
		aborted, abortKey := newStarting(t, db, acct, inst, now)
		if err := db.Abort(ctx, aborted, abortKey); err != nil {
			t.Fatal(err)
		}

		live := sorted(run.ID, ending.ID, starting.ID, crashed.ID)
		check := func(what string, want []string) {
			t.Helper()
			for _, scope := range [][2]string{{acct, inst}, {acct, ""}, {"", ""}} {
				rc.reads.Store(0)
				ws, err := db.LiveWorkspaces(ctx, scope[0], scope[1], now)
				if err != nil {
					t.Fatal(err)
				}
				// Every account's walk lists other tests' accounts too.
				ws = slices.DeleteFunc(ws, func(w sandgate.Workspace) bool { return w.AccountID != acct })
				if got := ids(ws); !slices.Equal(got, want) {
					t.Errorf("%s: LiveWorkspaces(%q, %q) = %v; want %v", what, scope[0], scope[1], got, want)
				}
				if n := rc.reads.Load(); n != int64(len(want)) {
					t.Errorf("%s: LiveWorkspaces(%q, %q) read %d records; want %d, the live ones", what, scope[0], scope[1], n, len(want))
				}
			}
			rc.reads.Store(0)
			page, next, err := db.ListWorkspaces(ctx, acct, inst, "", 100, true, now)
			if err != nil || next != "" {
				t.Fatalf("ListWorkspaces = %v, %q", err, next)
			}
			if got := ids(page); !slices.Equal(got, want) {
				t.Errorf("%s: ListWorkspaces(live) = %v; want %v", what, got, want)
			}
			if n := rc.reads.Load(); n != int64(len(want)) {
				t.Errorf("%s: ListWorkspaces(live) read %d records; want %d", what, n, len(want))
			}
		}
		check("before", live)

		// The gateway that created crashed died before confirming: the
		// reaper fails the create (terminating, still live) and then
		// records its end (out of the walks).
		if started, err := db.FailCreate(ctx, crashed, now); err != nil || !started {
			t.Fatalf("FailCreate = %v, %v", started, err)
		}
		check("create failed", live)
		if err := db.FinishTerminate(ctx, crashed, now, store.Egress{}); err != nil {
			t.Fatal(err)
		}
		if err := db.FinishTerminate(ctx, ending, now, store.Egress{}); err != nil {
			t.Fatal(err)
		}
		check("ended", sorted(run.ID, starting.ID))

		all, err := db.Workspaces(ctx, acct, inst, true, now)
		if err != nil || len(all) != 64 {
			t.Errorf("Workspaces(all) = %d records, %v; want 64 (every one within retention but the aborted)", len(all), err)
		}
	})
}

// TestLiveIndexUpgrade: over a Redis written by brokers without the live
// index, a broker finds every live workspace all the same: those recorded
// before (indexed once per process from the full index, terminated ones
// left out), one admitted meanwhile by an older broker (found by its slot
// and indexed), and an entry left behind by an older broker's end is
// dropped; after that first walk, a walk reads only the live records.
func TestLiveIndexUpgrade(t *testing.T) {
	redistest.Each(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Second)
		acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
		old := store.New(store.Config{}, rdb)
		tenant(t, old, acct, inst, now)
		for range 30 {
			terminated(t, old, newRunning(t, old, acct, inst, now), now)
		}
		run := newRunning(t, old, acct, inst, now)
		ending := newRunning(t, old, acct, inst, now)
		if _, _, err := old.BeginTerminate(ctx, ending, sandgate.ReasonReleased, now); err != nil {
			t.Fatal(err)
		}
		starting, _ := newStarting(t, old, acct, inst, now)
		liveIndex := store.AdmissionKeys(acct, inst, "", "").LiveIndex
		if err := rdb.Del(ctx, liveIndex).Err(); err != nil { // as an older broker left it
			t.Fatal(err)
		}

		rc := &readCounter{tag: "{" + acct + "}:ws:"}
		rdb.AddHook(rc)
		db := store.New(store.Config{}, rdb) // the upgraded broker's process
		want := sorted(run.ID, ending.ID, starting.ID)
		ws, err := db.LiveWorkspaces(ctx, "", "", now)
		if err != nil {
			t.Fatal(err)
		}
		ws = slices.DeleteFunc(ws, func(w sandgate.Workspace) bool { return w.AccountID != acct })
		if got := ids(ws); !slices.Equal(got, want) {
			t.Fatalf("first walk after the upgrade = %v; want %v", got, want)
		}
		if n, err := rdb.ZCard(ctx, liveIndex).Result(); err != nil || n != 3 {
			t.Errorf("live index built with %d entries, %v; want 3", n, err)
		}

		// An older broker admits one (no live index entry) and ends another
		// (its entry stays behind).
		byOld := newRunning(t, old, acct, inst, now)
		if err := rdb.ZRem(ctx, liveIndex, byOld.ID).Err(); err != nil {
			t.Fatal(err)
		}
		if err := old.FinishTerminate(ctx, ending, now, store.Egress{}); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZAdd(ctx, liveIndex, redis.Z{Score: float64(ending.CreatedAt.UnixMilli()), Member: ending.ID}).Err(); err != nil {
			t.Fatal(err)
		}
		want = sorted(run.ID, starting.ID, byOld.ID)
		for pass := range 2 {
			rc.reads.Store(0)
			ws, err := db.LiveWorkspaces(ctx, acct, inst, now)
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(ws); !slices.Equal(got, want) {
				t.Errorf("pass %d: LiveWorkspaces = %v; want %v", pass, got, want)
			}
			// The first pass reads the entry left behind once, to drop it.
			if n, wantReads := rc.reads.Load(), int64(len(want)+1-pass); n != wantReads {
				t.Errorf("pass %d: read %d records; want %d", pass, n, wantReads)
			}
		}
		page, _, err := db.ListWorkspaces(ctx, acct, inst, "", 100, true, now)
		if got := ids(page); err != nil || !slices.Equal(got, want) {
			t.Errorf("ListWorkspaces(live) = %v, %v; want %v", got, err, want)
		}
		// One an older broker admitted since, listed before any walk
		// has met it.
		byOld2 := newRunning(t, old, acct, inst, now)
		if err := rdb.ZRem(ctx, liveIndex, byOld2.ID).Err(); err != nil {
			t.Fatal(err)
		}
		want = sorted(run.ID, starting.ID, byOld.ID, byOld2.ID)
		page, _, err = db.ListWorkspaces(ctx, acct, inst, "", 100, true, now)
		if got := ids(page); err != nil || !slices.Equal(got, want) {
			t.Errorf("ListWorkspaces(live), before any walk = %v, %v; want %v", got, err, want)
		}
	})
}

// TestConfirmAnswersTheRecord: the record a confirm answers without
// reading it is the record a read answers.
func TestConfirmAnswersTheRecord(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now().UTC()
		acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
		w, key := newStarting(t, db, acct, inst, now.Truncate(time.Second))
		got, ok, err := db.ConfirmRecord(ctx, w, "ref-1", now, key, "h")
		if err != nil || !ok {
			t.Fatalf("ConfirmRecord = %v, %v", ok, err)
		}
		read, err := db.Workspace(ctx, acct, w.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, read) {
			t.Errorf("ConfirmRecord answered\n%+v\nwant the record as read\n%+v", got, read)
		}
	})
}

// TestLiveWalkPrunesTheIndex: the background walks keep the full index
// bounded as a listing does, dropping entries older than retention and a
// day (their records can only have expired), even when nobody lists every
// workspace.
func TestLiveWalkPrunesTheIndex(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Second)
		acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
		old := now.Add(-db.Config().Retention - 25*time.Hour)
		terminated(t, db, newRunning(t, db, acct, inst, old), old)
		recent := newRunning(t, db, acct, inst, now)
		if _, err := db.LiveWorkspaces(ctx, acct, inst, now); err != nil {
			t.Fatal(err)
		}
		idx := store.AdmissionKeys(acct, inst, "", "").Index
		if got, err := db.Redis().ZRange(ctx, idx, 0, -1).Result(); err != nil || !slices.Equal(got, []string{recent.ID}) {
			t.Errorf("index after a live walk = %v, %v; want only %s", got, err, recent.ID)
		}
	})
}

// beforeCmd runs fn before each command named name (lower case).
type beforeCmd struct {
	name string
	fn   func()
}

func (h *beforeCmd) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *beforeCmd) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == h.name {
			h.fn()
		}
		return next(ctx, cmd)
	}
}

func (h *beforeCmd) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestLiveWalkWhileListedOnesEnd: a live listing lists every workspace
// past its cursor exactly once while workspaces it already listed leave
// the live index during its batches, even when more than a batch of them
// share one score (creation times are whole seconds): an offset into such
// a run would shift past entries it never read.
func TestLiveWalkWhileListedOnesEnd(t *testing.T) {
	eachCountedDB(t, func(t *testing.T, db *store.DB, _ *readCounter, acct string) {
		ctx := context.Background()
		inst := sandgate.NewID("inst_")
		now := time.Now().UTC().Truncate(time.Second)
		var all []string
		for range 400 {
			w, _ := newStarting(t, db, acct, inst, now)
			all = append(all, w.ID)
		}
		slices.Sort(all) // one score: the walk's order
		first, cursor, err := db.ListWorkspaces(ctx, acct, inst, "", 200, true, now)
		if err != nil || len(first) != 200 || cursor == "" {
			t.Fatalf("ListWorkspaces = %d, %q, %v; want 200 and a cursor", len(first), cursor, err)
		}
		// The second page's walk reads the 200 listed entries in batches
		// before it finds one past its cursor; before its third batch, 50
		// of the listed workspaces end (as releases take them out of the
		// live index).
		liveIdx := "sg:{" + acct + "}:inst:" + inst + ":ws:live"
		batches := 0
		db.Redis().AddHook(&beforeCmd{name: "zrangebyscore", fn: func() {
			if batches++; batches == 3 {
				for _, id := range all[:50] {
					db.Redis().ZRem(ctx, liveIdx, id)
				}
			}
		}})
		rest, next, err := db.ListWorkspaces(ctx, acct, inst, cursor, 300, true, now)
		if err != nil || next != "" {
			t.Fatalf("ListWorkspaces = %q, %v; want the last page", next, err)
		}
		if batches < 3 {
			t.Fatalf("the second page read %d batches; the test wants at least 3", batches)
		}
		if got, want := ids(rest), all[200:]; !slices.Equal(got, want) {
			t.Errorf("second page lists %d workspaces; want the %d past the cursor", len(got), len(want))
		}
	})
}
