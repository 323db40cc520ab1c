//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
)

// The obligation tests check the broker's background duties (spec
// §Broker obligations) on real processes: `sandgate serve` gateways that
// are SIGKILLed as a crash would, their reapers, and the local provider's
// per-workspace supervisor, over one redis-server per test.

// obligationsInstance creates an account and an instance with the given
// concurrency and lifetime through the admin CLI, and returns the account,
// the instance and a token of it.
func obligationsInstance(t testing.TB, gw *serveBroker, name string, maxConcurrent int, lifetime time.Duration) (acct, inst, tok string) {
	t.Helper()
	adm := gw.Admin(t)
	acct = createAccount(t, adm, name)
	inst = strings.TrimSpace(runCLI(t, gw.AdminEnv(), "admin", "instance", "create", "--account", acct,
		"--max-concurrent", strconv.Itoa(maxConcurrent), "--max-lifetime", lifetime.String()))
	return acct, inst, issueToken(t, adm, inst)
}

// workspaceDir is the local provider's directory of a workspace.
func workspaceDir(cfg *serveConfig, id string) string {
	return filepath.Join(cfg.DataDir, "local", "workspaces", id)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// withMarker returns the pids of the processes whose command line holds
// marker.
func withMarker(marker string) []int {
	var out []int
	for _, ps := range readProcs() {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(ps.pid) + "/cmdline")
		if strings.Contains(string(b), marker) {
			out = append(out, ps.pid)
		}
	}
	return out
}

// waitTerminated polls the workspace through c until it reads terminated,
// and fails the test unless the reason is want. Past its expires_at a
// workspace answers 410 workspace_gone, reason expired, to every
// operation (spec), whatever its record says: for want "expired" that
// answer is what is checked, after the caller read the record itself
// (waitRecordTerminated).
func waitTerminated(t testing.TB, c *client.Client, id, want string) {
	t.Helper()
	if want == string(sandgate.ReasonExpired) {
		_, err := c.Workspace(context.Background(), id)
		wantCode(t, "the status of expired workspace "+id, err, http.StatusGone, protocol.WorkspaceGone)
		if e := (*client.Error)(nil); errors.As(err, &e) && e.Details["reason"] != want {
			t.Fatalf("the status of expired workspace %s: reason %v; want %s", id, e.Details["reason"], want)
		}
		return
	}
	var got *protocol.Workspace
	waitFor(t, "workspace "+id+" to read terminated", func() (bool, error) {
		w, err := c.Workspace(context.Background(), id)
		if err != nil {
			return false, err
		}
		got = w
		return w.State == "terminated", fmt.Errorf("state %s", w.State)
	})
	if got.TerminationReason == nil || *got.TerminationReason != want {
		t.Fatalf("workspace %s = %s; want terminated with reason %s", id, mustJSON(t, got), want)
	}
}

// waitRecordTerminated polls the workspace's record in Redis, not through
// a gateway (reading an expired workspace through one ends it at once;
// docs/protocol-notes.md), until it is terminated, and returns its
// termination reason.
func waitRecordTerminated(t testing.TB, rdb *redis.Client, acct, id string) (reason string) {
	t.Helper()
	waitFor(t, "the record of "+id+" to be terminated", func() (bool, error) {
		f, err := rdb.HMGet(context.Background(), "sg:{"+acct+"}:ws:"+id, "state", "reason").Result()
		if err != nil || len(f) != 2 {
			return false, err
		}
		st, _ := f[0].(string)
		reason, _ = f[1].(string)
		return st == "terminated", fmt.Errorf("state %q", st)
	})
	return reason
}

// logLines returns the JSON log lines of logs whose msg is msg.
func logLines(logs, msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg {
			out = append(out, line)
		}
	}
	return out
}

// acquirePausedAfterCreate starts an acquire under key on gw, a gateway
// started with SANDGATE_TEST_PAUSE_AFTER_CREATE=pause, and returns once the
// provider create is done and the acquire is held before its confirm: the
// workspace's id, and where the acquire's error arrives (it is cancelled
// when the test ends).
func acquirePausedAfterCreate(ctx context.Context, t testing.TB, gw *serveBroker, tok, pause, key string) (id string, done <-chan error) {
	t.Helper()
	acqCtx, cancelAcq := context.WithCancel(ctx)
	t.Cleanup(cancelAcq)
	acqDone := make(chan error, 1)
	req := protocol.AcquireRequest{Label: "e2e", Egress: noEgress()}
	go func() {
		_, _, err := gw.Client(t, tok).Acquire(acqCtx, key, req)
		acqDone <- err
	}()
	waitFor(t, "the acquire to pause after the provider create", func() (bool, error) {
		entries, err := os.ReadDir(pause)
		if err != nil || len(entries) == 0 {
			return false, err
		}
		id = entries[0].Name()
		return true, nil
	})
	return id, acqDone
}

// wantNoSlots fails the test unless the instance's concurrency slots and
// the account's open reservations are all free.
func wantNoSlots(t testing.TB, rdb *redis.Client, acct, inst string) {
	t.Helper()
	for _, key := range []string{
		"sg:{" + acct + "}:inst:" + inst + ":live",
		"sg:{" + acct + "}:open",
	} {
		if n, err := rdb.ZCard(context.Background(), key).Result(); err != nil || n != 0 {
			members, _ := rdb.ZRange(context.Background(), key, 0, -1).Result()
			t.Errorf("ZCARD %s = %d, %v (%v); want 0", key, n, err, members)
		}
	}
}

// shortLifetime is the lifetime of a workspace a test watches end with no
// gateway running: the acquire and the first exec or command, which must
// come before the end, take seconds on a loaded machine.
const shortLifetime = 20 * time.Second

// TestLifetimeEndsWithoutGateways: a workspace with a short lifetime
// ends on time with every gateway process stopped: the local provider's
// supervisor kills its durable command and makes it unusable, and the
// first reaper pass of a gateway started afterwards records it expired.
func TestLifetimeEndsWithoutGateways(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs, cfg, gwA, gwB := startPair(t)
	acct, inst, tok := obligationsInstance(t, gwA, "e2e-lifetime", 1, shortLifetime)
	c := gwA.Client(t, tok)
	ws := acquire(t, c, "lifetime-1")

	// A unique argument names the command's process on this host.
	marker := fmt.Sprintf("600.%09d", rand.IntN(1e9))
	_, launched, err := gwB.Client(t, tok).StartCommand(ctx, ws.WorkspaceID, "tool:sleep",
		protocol.ExecRequest{Argv: []string{"sleep", marker}, TimeoutSeconds: 600})
	if err != nil || !launched {
		t.Fatalf("StartCommand = %v, launched %v; want launched", err, launched)
	}
	waitFor(t, "the command's sleep to start", func() (bool, error) {
		return len(withMarker(marker)) > 0, nil
	})

	gwA.kill()
	gwB.kill()

	waitFor(t, "the workspace's processes to end with no gateway running", func() (bool, error) {
		left := withMarker(marker)
		return len(left) == 0, fmt.Errorf("sleep %s still runs: pids %v", marker, left)
	})
	// Unusable: the provider, as any future gateway would open it, refuses it.
	prov, err := local.New(ctx, local.Config{DataDir: filepath.Join(cfg.DataDir, "local")},
		providers.Env{BrokerID: "sandgate-e2e", DataDir: cfg.DataDir})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	if _, err := prov.Exec(ctx, providers.Sandbox{Ref: ws.WorkspaceID}, providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Minute}); !errors.Is(err, providers.ErrSandboxGone) {
		t.Fatalf("exec in the workspace after its lifetime, with no gateway: %v; want the sandbox gone", err)
	}

	gwC := startServe(t, cfg)
	cC := gwC.Client(t, tok)
	if r := waitRecordTerminated(t, rs.Client(), acct, ws.WorkspaceID); r != "expired" {
		t.Errorf("workspace %s ended %q; want expired", ws.WorkspaceID, r)
	}
	waitTerminated(t, cC, ws.WorkspaceID, "expired")
	wantNoSlots(t, rs.Client(), acct, inst)
	// The line follows the recorded end: wait for it, then count.
	waitFor(t, "the reaper's log line", func() (bool, error) {
		return len(logLines(gwC.Logs(), "reaper ended a workspace")) >= 1, nil
	})
	if ended := logLines(gwC.Logs(), "reaper ended a workspace"); len(ended) != 1 || ended[0][sandgate.KeyWorkspaceID] != ws.WorkspaceID {
		t.Errorf("the new gateway's reaper logged %v; want one \"reaper ended a workspace\" for %s", ended, ws.WorkspaceID)
	}
	waitFor(t, "the workspace directory to be removed", func() (bool, error) {
		return !exists(workspaceDir(cfg, ws.WorkspaceID)), nil
	})
	if _, err := cC.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"true"}}); err == nil {
		t.Fatal("exec in the expired workspace succeeded")
	} else {
		wantCode(t, "exec in the expired workspace", err, http.StatusGone, protocol.WorkspaceGone)
	}
	// The slot is free: a new workspace is admitted at max-concurrent 1.
	w2 := acquire(t, cC, "lifetime-2")
	if _, err := cC.Release(ctx, w2.WorkspaceID); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestGatewayDiesBetweenCreateAndConfirm: a gateway SIGKILLed after the
// provider created the sandbox and before the record was confirmed (the
// test-only pause SANDGATE_TEST_PAUSE_AFTER_CREATE holds it there) leaves
// a starting record and a sandbox; a gateway started afterwards ends the
// workspace once its pending deadline passed (terminated, failed), frees
// its slot, removes the sandbox, and a replay of the Idempotency-Key is a
// fresh evaluation (docs/protocol-notes.md, unknown creates).
func TestGatewayDiesBetweenCreateAndConfirm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := startRedis(t)
	rdb := rs.Client()
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	appendConfig(t, cfg, "admission:\n  pending_timeout: 3s\n")
	pause := t.TempDir()
	gwA := startServeEnv(t, cfg, "SANDGATE_TEST_PAUSE_AFTER_CREATE="+pause)
	acct, inst, tok := obligationsInstance(t, gwA, "e2e-unknown-create", 1, time.Hour)

	id, acqDone := acquirePausedAfterCreate(ctx, t, gwA, tok, pause, "unknown-create")
	gwA.kill()
	if err := <-acqDone; err == nil {
		t.Fatal("the acquire answered although its gateway was killed before confirming")
	}
	if st, err := rdb.HGet(ctx, "sg:{"+acct+"}:ws:"+id, "state").Result(); err != nil || st != "starting" {
		t.Fatalf("record of %s after the kill: state %q, %v; want starting", id, st, err)
	}
	if !exists(workspaceDir(cfg, id)) {
		t.Fatalf("no sandbox directory for %s: the provider create did not run", id)
	}

	gwB := startServe(t, cfg)
	cB := gwB.Client(t, tok)
	waitTerminated(t, cB, id, "failed")
	wantNoSlots(t, rdb, acct, inst)
	waitFor(t, "the sandbox directory to be removed", func() (bool, error) {
		return !exists(workspaceDir(cfg, id)), nil
	})
	// The reaper logs once the end is recorded, so the state can be read
	// a moment before the line is written.
	waitFor(t, "the reaper's log line", func() (bool, error) {
		n := len(logLines(gwB.Logs(), "reaper ended an unconfirmed create"))
		return n >= 1, fmt.Errorf("logged %d times", n)
	})
	if n := len(logLines(gwB.Logs(), "reaper ended an unconfirmed create")); n != 1 {
		t.Errorf("\"reaper ended an unconfirmed create\" logged %d times; want 1", n)
	}

	// The key was still in progress and is freed: the replay creates afresh
	// (a 201 and a new workspace), in the freed slot (max-concurrent 1).
	w2, created, err := cB.Acquire(ctx, "unknown-create", protocol.AcquireRequest{Label: "e2e", Egress: noEgress()})
	if err != nil || !created || w2.WorkspaceID == id || w2.State != "running" {
		t.Fatalf("replay of the key = %s, created %v, %v; want 201 and a new running workspace", mustJSON(t, w2), created, err)
	}
	if _, err := cB.Release(ctx, w2.WorkspaceID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	w3 := acquire(t, cB, "after-unknown-create")
	if _, err := cB.Release(ctx, w3.WorkspaceID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantNoSlots(t, rdb, acct, inst)
	if got, err := cB.Workspace(ctx, id); err != nil || got.State != "terminated" {
		t.Errorf("the failed workspace afterwards = %s, %v; want still terminated", mustJSON(t, got), err)
	}
}

// leaderOf returns the gateway whose reaper holds the lease with the
// current fencing token (its "reaper leading" log line names the token),
// and the token.
func leaderOf(t testing.TB, rdb *redis.Client, gws ...*serveBroker) (*serveBroker, int64) {
	t.Helper()
	var leader *serveBroker
	var fence int64
	waitFor(t, "a reaper to lead", func() (bool, error) {
		n, err := rdb.Get(context.Background(), "sg:{reaper}:fence").Int64()
		if err != nil {
			return false, err
		}
		for _, gw := range gws {
			for _, l := range logLines(gw.Logs(), "reaper leading") {
				if f, _ := l["fence"].(float64); int64(f) == n {
					leader, fence = gw, n
					return true, nil
				}
			}
		}
		return false, fmt.Errorf("no gateway logged leading with fence %d", n)
	})
	return leader, fence
}

// TestReaperLeaderTakeover: with two gateways, the one whose reaper leads
// is frozen (SIGSTOP) while N workspaces come due and then SIGKILLed; the
// other gateway's reaper takes the lease over (the fence grows) and ends
// every one of them exactly once with reason expired, leaving no slot and
// no reservation held.
func TestReaperLeaderTakeover(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	rdb := rs.Client()
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	gws := []*serveBroker{startServe(t, cfg), startServe(t, cfg)}
	leader, fence := leaderOf(t, rdb, gws...)
	follower := gws[0]
	if follower == leader {
		follower = gws[1]
	}
	const n = 6
	// shortLifetime: the n acquires come before the first workspace is
	// due, however slowly a loaded machine makes them.
	acct, inst, tok := obligationsInstance(t, follower, "e2e-takeover", n, shortLifetime)
	c := follower.Client(t, tok)

	// Frozen, the leader holds the lease but reaps nothing; its lease
	// runs out while the workspaces come due.
	if err := leader.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	var last time.Time
	for i := range n {
		w := acquire(t, c, fmt.Sprintf("takeover-%d", i))
		ids[w.WorkspaceID] = true
		exp, err := time.Parse(time.RFC3339, w.ExpiresAt)
		if err != nil {
			t.Fatalf("expires_at %q: %v", w.ExpiresAt, err)
		}
		last = exp
	}
	waitFor(t, "every workspace to be past its expires_at", func() (bool, error) {
		return time.Now().After(last), nil
	})
	leader.kill()

	var next int64
	waitFor(t, "the other gateway's reaper to take the lease over", func() (bool, error) {
		l, f := leaderOf(t, rdb, follower)
		next = f
		return l == follower && f > fence, fmt.Errorf("fence %d", f)
	})
	for id := range ids {
		if r := waitRecordTerminated(t, rdb, acct, id); r != "expired" {
			t.Errorf("workspace %s ended %q; want expired", id, r)
		}
		waitTerminated(t, c, id, "expired")
	}
	// Exactly once: one "reaper ended a workspace" per workspace, in all.
	// The lines follow the recorded ends: wait until all are written.
	waitFor(t, "the reaper's log lines", func() (bool, error) {
		total := 0
		for _, gw := range gws {
			total += len(logLines(gw.Logs(), "reaper ended a workspace"))
		}
		return total >= len(ids), fmt.Errorf("%d lines", total)
	})
	ended := map[string]int{}
	for _, gw := range gws {
		for _, l := range logLines(gw.Logs(), "reaper ended a workspace") {
			id, _ := l[sandgate.KeyWorkspaceID].(string)
			ended[id]++
			if l["reason"] != "expired" {
				t.Errorf("reaped %s with reason %v; want expired", id, l["reason"])
			}
		}
	}
	for id := range ids {
		if ended[id] != 1 {
			t.Errorf("workspace %s reaped %d times; want exactly once", id, ended[id])
		}
	}
	if len(ended) != n {
		t.Errorf("reaped %v; want exactly the %d workspaces", ended, n)
	}
	if o := logLines(follower.Logs(), "reaper terminated an orphan"); len(o) != 0 {
		t.Errorf("the reaper logged %d orphans; want none (every sandbox had a record)", len(o))
	}
	t.Logf("fence %d → %d", fence, next)
	wantNoSlots(t, rdb, acct, inst)
	waitFor(t, "every workspace directory to be removed", func() (bool, error) {
		entries, err := os.ReadDir(filepath.Join(cfg.DataDir, "local", "workspaces"))
		return err == nil && len(entries) == 0, fmt.Errorf("%d left, %v", len(entries), err)
	})
}

// TestOrphanSweep: a sandbox created straight through the provider with
// this broker's labels and no record (an unknown instance, or a known one
// with no such workspace) is terminated by the running gateway's reaper;
// one with another broker's id, and a directory without labels, are never
// touched.
func TestOrphanSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, cfg, gw := startOne(t)
	_, inst, _ := obligationsInstance(t, gw, "e2e-orphans", 1, time.Hour)

	dataDir := filepath.Join(cfg.DataDir, "local")
	newProv := func(broker string) *local.Provider {
		p, err := local.New(ctx, local.Config{DataDir: dataDir}, providers.Env{BrokerID: broker, DataDir: cfg.DataDir})
		if err != nil {
			t.Fatalf("local.New: %v", err)
		}
		return p
	}
	create := func(p *local.Provider, inst string) string {
		id := sandgate.NewID(sandgate.PrefixWorkspace)
		size, _ := sandgate.LookupSize("small")
		if _, err := p.Create(ctx, providers.CreateSpec{WorkspaceID: id, InstanceID: inst, Size: size}); err != nil {
			t.Fatalf("provider create: %v", err)
		}
		return id
	}
	// First what must stay: another broker's sandbox and an unlabelled one.
	other := newProv("another-broker")
	foreign := create(other, inst)
	t.Cleanup(func() { other.Terminate(context.Background(), providers.Sandbox{Ref: foreign}) })
	bare := sandgate.NewID(sandgate.PrefixWorkspace)
	if err := os.MkdirAll(filepath.Join(workspaceDir(cfg, bare), "workspace"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(workspaceDir(cfg, bare)) })

	ours := newProv("sandgate-e2e")
	orphans := []string{create(ours, "inst_unknown"), create(ours, inst)}
	logged := map[string]bool{}
	for _, id := range orphans {
		waitFor(t, "orphan "+id+" to be terminated and logged", func() (bool, error) {
			for _, l := range logLines(gw.Logs(), "reaper terminated an orphan") {
				id, _ := l[sandgate.KeyWorkspaceID].(string)
				logged[id] = true
			}
			return logged[id] && !exists(workspaceDir(cfg, id)), fmt.Errorf("logged %v", logged[id])
		})
	}
	// The pass that removed the orphans listed the others too (they were
	// made first), and left them.
	for _, id := range []string{foreign, bare} {
		if !exists(workspaceDir(cfg, id)) {
			t.Errorf("sandbox %s (not this broker's) was removed", id)
		}
		if logged[id] {
			t.Errorf("sandbox %s (not this broker's) was logged as an orphan", id)
		}
	}
}
