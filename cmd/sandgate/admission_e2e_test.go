//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/protocol"
)

// The admission tests drive admission end to end on the real binary: two
// `sandgate serve` processes over one redis-server, the operator CLI
// against one gateway's admin API and the v1 client against both.

// appendConfig appends YAML to a serve config. newServeConfig writes no
// admission section, so an appended top-level admission: block is the
// only one.
func appendConfig(t testing.TB, cfg *serveConfig, yaml string) {
	t.Helper()
	f, err := os.OpenFile(cfg.Path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(yaml); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// generousAdmission keeps the per-token rate limits and the account risk
// defaults out of the way, so only the check under test refuses.
const generousAdmission = `admission:
  timeout: %s
  risk:
    acquires_per_minute: 100000
    max_open_workspaces: 100000
  rate_limits:
    read: {per_second: 10000, burst: 10000}
    acquire: {per_second: 10000, burst: 10000}
    exec: {per_second: 10000, burst: 10000}
`

// wantRefused acquires with key and fails the test unless the broker
// refused with status, code and, when reason is not empty, details.reason.
func wantRefused(t testing.TB, what string, c *client.Client, key string, status int, code protocol.Code, reason string) {
	t.Helper()
	ws, _, err := c.Acquire(context.Background(), key, protocol.AcquireRequest{Label: "e2e", Egress: noEgress()})
	if err == nil {
		t.Fatalf("%s: admitted %s; want %d %s", what, ws.WorkspaceID, status, code)
	}
	wantCode(t, what, err, status, code)
	if reason == "" {
		return
	}
	var e *client.Error
	errors.As(err, &e)
	if got, _ := e.Details["reason"].(string); got != reason {
		t.Fatalf("%s: details.reason %q (details %v); want %q", what, got, e.Details, reason)
	}
}

// TestAdmission300AcrossTwoGateways: 300 acquires racing on one instance
// through two gateways admit exactly max_concurrent_workspaces, refuse the
// rest with 429 concurrency_limit, and releasing them leaves no slot, no
// open reservation and no workspace directory behind.
func TestAdmission300AcrossTwoGateways(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := startRedis(t)
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	// A long Redis bound: 150 requests at once on each race-built gateway
	// queue for its connection pool, and that wait counts against it.
	appendConfig(t, cfg, fmt.Sprintf(generousAdmission, "15s"))
	gwA := startServe(t, cfg)
	gwB := startServe(t, cfg)

	const limit, racers = 5, 300
	adm := gwA.Admin(t)
	acct := createAccount(t, adm, "e2e-admission-300")
	inst := strings.TrimSpace(runCLI(t, gwA.AdminEnv(), "admin", "instance", "create",
		"--account", acct, "--max-concurrent", "5"))
	tok := issueToken(t, adm, inst)
	clients := warmClients(ctx, t, tok, gwA, gwB)

	won := wantConcurrencySplit(t, raceAcquires(ctx, clients, "race", racers), limit)
	for _, r := range won {
		if r.ws.State != "running" {
			t.Errorf("admitted workspace %s is %s; want running", r.ws.WorkspaceID, r.ws.State)
		}
	}

	releaseCrosswise(ctx, t, clients, won)

	wantNoSlots(t, rs.Client(), acct, inst)
	wantNoLocalWorkspaces(t, cfg.DataDir)
}

// TestRedisOutageFailsClosed: with Redis down, Acquire is refused with 503
// admission_unavailable (never admitted) and the lease reports admission
// paused for reason unavailable; once Redis is back, both gateways admit
// again without a restart, and the Idempotency-Key that was refused creates.
func TestRedisOutageFailsClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := startRedis(t)
	rdb := rs.Client()
	// Nothing written before the kill may be lost: Restart replays the AOF.
	if err := rdb.ConfigSet(ctx, "appendfsync", "always").Err(); err != nil {
		t.Fatalf("CONFIG SET appendfsync always: %v", err)
	}
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	appendConfig(t, cfg, fmt.Sprintf(generousAdmission, "1s"))
	gwA := startServe(t, cfg)
	gwB := startServe(t, cfg)
	adm, inst := newAccountInstance(t, gwA, "e2e-outage", 2)
	tok := issueToken(t, adm, inst)
	clients := []*client.Client{gwA.Client(t, tok), gwB.Client(t, tok)}

	// Use the token on both gateways, and make sure each answers it from
	// its cache: that is what lets them authenticate during the outage.
	for _, c := range clients {
		ws := acquire(t, c, "before-outage-"+randHex(4))
		if _, err := c.Release(ctx, ws.WorkspaceID); err != nil {
			t.Fatalf("Release: %v", err)
		}
		proveCached(t, rdb, c, tok)
	}

	rs.Kill()

	const key = "during-outage"
	for i, c := range clients {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		ws, _, err := c.Acquire(cctx, key, protocol.AcquireRequest{Label: "e2e", Egress: noEgress()})
		expired := cctx.Err() != nil
		cancel()
		if expired {
			t.Fatalf("gateway %d: Acquire with Redis down did not return within 20s (%v); it must fail promptly", i, err)
		}
		if err == nil {
			t.Fatalf("gateway %d: Acquire with Redis down admitted %s; want 503 admission_unavailable", i, ws.WorkspaceID)
		}
		wantCode(t, fmt.Sprintf("gateway %d: Acquire with Redis down", i), err, http.StatusServiceUnavailable, protocol.AdmissionUnavailable)
	}

	// gateway/lease.go: the stop state cannot be read, so the lease says
	// paused, reason unavailable (spec §GET /v1/lease); the token itself is
	// served from the cache entry filled above (gateway/authcache.go stale).
	for i, c := range clients {
		waitFor(t, fmt.Sprintf("gateway %d's lease to report admission unavailable", i), func() (bool, error) {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			l, err := c.Lease(cctx)
			if err != nil {
				if cctx.Err() != nil {
					t.Fatalf("gateway %d: Lease with Redis down did not return within 20s", i)
				}
				return false, err
			}
			return l.Admission.State == protocol.AdmissionPaused && l.Admission.Reason == "unavailable",
				fmt.Errorf("admission %+v", l.Admission)
		})
	}

	// The operator API cannot read the stop state either: 503, never 500.
	for i, gw := range []*serveBroker{gwA, gwB} {
		err := gw.Operator(t).Do(ctx, http.MethodGet, "/status", nil, &adminapi.Status{})
		var ae *adminapi.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || ae.Code != protocol.Unavailable {
			t.Errorf("gateway %d: GET /admin/v1/status with Redis down = %v; want 503 unavailable", i, err)
		}
	}

	rs.Restart()

	// Both gateways reconnect and admit again on their own. The lease
	// reading open once is not enough: for up to a second after Redis is
	// back, go-redis's dial circuit breaker (open after PoolSize failed
	// dials, probed once a second) still fails some new connections, and
	// requests that need one answer 503 meanwhile. So the client does what
	// the spec asks of it: it retries the refused Acquire with the same
	// Idempotency-Key until it gets another answer than 503.
	for i, c := range clients {
		waitFor(t, fmt.Sprintf("gateway %d's lease to report admission open", i), func() (bool, error) {
			l, err := c.Lease(ctx)
			if err != nil {
				return false, err
			}
			return l.Admission.State == protocol.AdmissionOpen, fmt.Errorf("admission %+v", l.Admission)
		})
	}
	// The key the outage refused claimed nothing: it creates now, and the
	// other gateway replays it.
	ws, created, err := acquireAfterOutage(t, clients[0], key)
	if err != nil || !created {
		t.Fatalf("Acquire %s on gateway A after the restart = created %v, %v; want 201", key, created, err)
	}
	again, created, err := acquireAfterOutage(t, clients[1], key)
	if err != nil || created || again.WorkspaceID != ws.WorkspaceID {
		t.Fatalf("Acquire %s on gateway B after the restart = %+v, created %v, %v; want 200 with %s", key, again, created, err, ws.WorkspaceID)
	}
	ws2, created, err := acquireAfterOutage(t, clients[1], "after-outage")
	if err != nil || !created {
		t.Fatalf("Acquire of a new key on gateway B after the restart = created %v, %v; want 201", created, err)
	}
	for _, w := range []*protocol.Workspace{ws, ws2} {
		if _, err := clients[0].Release(ctx, w.WorkspaceID); err != nil {
			t.Fatalf("Release %s: %v", w.WorkspaceID, err)
		}
	}
}

// acquireAfterOutage retries an Acquire with one Idempotency-Key while the
// gateway answers 503 (admission_unavailable, or unavailable while it
// cannot read the token it dropped from its cache on reconnecting), as a
// client does, and returns the first other answer.
func acquireAfterOutage(t testing.TB, c *client.Client, key string) (ws *protocol.Workspace, created bool, err error) {
	t.Helper()
	waitFor(t, "Acquire "+key+" to get past 503", func() (bool, error) {
		ws, created, err = c.Acquire(context.Background(), key, protocol.AcquireRequest{Label: "e2e", Egress: noEgress()})
		code := client.CodeOf(err)
		return code != protocol.AdmissionUnavailable && code != protocol.Unavailable, err
	})
	return ws, created, err
}

// sleepers returns the `sleep` processes among a gateway's descendants:
// the command of an exec in flight in one of its sandboxes.
func sleepers(s *serveBroker) []procStat {
	var out []procStat
	for _, p := range s.descendants() {
		if p.comm == "sleep" {
			out = append(out, p)
		}
	}
	return out
}

// TestEmergencyStopAcrossGateways: the broker-wide stop set through gateway
// A's admin API ends every running workspace, whichever gateway created it,
// and refuses Acquire on both gateways until it is lifted.
func TestEmergencyStopAcrossGateways(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, _, gwA, gwB := startPair(t)
	adm, inst := newAccountInstance(t, gwA, "e2e-stop", 3)
	tok := issueToken(t, adm, inst)
	cA, cB := gwA.Client(t, tok), gwB.Client(t, tok)
	clients := []*client.Client{cA, cB}

	ws := []*protocol.Workspace{acquire(t, cA, "stop-1"), acquire(t, cB, "stop-2"), acquire(t, cA, "stop-3")}

	// A long command in flight through gateway B, in a workspace gateway A
	// created; the stop is set through gateway A.
	execCtx, cancelExec := context.WithCancel(ctx)
	defer cancelExec()
	type execResult struct {
		res *protocol.ExecResponse
		err error
	}
	execDone := make(chan execResult, 1)
	go func() {
		res, err := cB.Exec(execCtx, ws[0].WorkspaceID, protocol.ExecRequest{Argv: []string{"sleep", "300"}, TimeoutSeconds: 600})
		execDone <- execResult{res, err}
	}()
	waitFor(t, "the exec's sleep to start in gateway B's sandbox", func() (bool, error) {
		return len(sleepers(gwB)) > 0, nil
	})

	out := strings.TrimSpace(runCLI(t, gwA.AdminEnv(), "admin", "stop", "on", "--reason", "incident"))
	if out != "terminated=3 failed=0" {
		t.Fatalf("admin stop on printed %q; want terminated=3 failed=0", out)
	}

	for i, c := range clients {
		for _, w := range ws {
			got, err := c.Workspace(ctx, w.WorkspaceID)
			if err != nil || got.State != "terminated" || got.TerminationReason == nil || *got.TerminationReason != "emergency_stopped" {
				t.Errorf("gateway %d: workspace %s after stop = %s, %v; want terminated, emergency_stopped", i, w.WorkspaceID, mustJSON(t, got), err)
			}
		}
		wantRefused(t, fmt.Sprintf("gateway %d: Acquire while stopped", i), c, fmt.Sprintf("stopped-%d", i),
			http.StatusForbidden, protocol.EmergencyStopped, "incident")
		l, err := c.Lease(ctx)
		if err != nil || l.Admission.State != protocol.AdmissionEmergencyStopped || l.Admission.Reason != "incident" {
			t.Errorf("gateway %d: Lease while stopped = %+v, %v; want emergency_stopped, incident", i, l, err)
		}
		// Release is never refused for a stop, and is idempotent.
		rel, err := c.Release(ctx, ws[i].WorkspaceID)
		if err != nil || (rel != nil && (rel.State != "terminated" || rel.TerminationReason == nil || *rel.TerminationReason != "emergency_stopped")) {
			t.Errorf("gateway %d: Release of a stopped workspace = %s, %v; want 200 terminated (or 404)", i, mustJSON(t, rel), err)
		}
	}

	// The in-flight command: its sandbox must be gone too, though gateway
	// A ended the workspace and gateway B started the command
	// (providers/local Terminate kills the execs any broker process
	// recorded in the workspace).
	// Bounded well below the sleep's 300 s, so a survivor is told from a
	// sleep that ended on its own; generous for a loaded machine.
	const killBound = time.Minute
	deadline := time.Now().Add(killBound)
	for len(sleepers(gwB)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := sleepers(gwB); len(left) > 0 {
		t.Errorf("the emergency stop set through gateway A terminated workspace %s, but the `sleep 300` exec "+
			"started through gateway B still runs %v later (pid %d)", ws[0].WorkspaceID, killBound, left[0].pid)
		cancelExec()
		<-execDone
	} else {
		// The exec's answer: 410 workspace_gone, as when its own gateway
		// terminates the workspace under it.
		r := <-execDone
		wantCode(t, "the exec in flight when its workspace was stopped", r.err, http.StatusGone, protocol.WorkspaceGone)
	}
	waitFor(t, "gateway B's sandbox processes to be gone", func() (bool, error) {
		left := gwB.sandboxProcs()
		return len(left) == 0, fmt.Errorf("%d left: %v", len(left), left)
	})

	if out := strings.TrimSpace(runCLI(t, gwA.AdminEnv(), "admin", "stop", "off")); out != "off" {
		t.Fatalf("admin stop off printed %q; want off", out)
	}
	for i, c := range clients {
		w := acquire(t, c, fmt.Sprintf("after-stop-%d", i))
		if _, err := c.Release(ctx, w.WorkspaceID); err != nil {
			t.Fatalf("gateway %d: Release after stop off: %v", i, err)
		}
	}
}

// TestPauseScopes: an instance's pause leaves its siblings admitting; the
// account's pause refuses all of them; each resume lifts only its own
// pause. status shows who paused what and why, and the audit export records
// every action with the operator's name and token prefix, never the token.
func TestPauseScopes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, cfg, gwA, gwB := startPair(t)
	env := gwA.AdminEnv()
	adm := gwA.Admin(t)
	acct := createAccount(t, adm, "e2e-pause")
	inst1, inst2 := createInstance(t, adm, acct, 2), createInstance(t, adm, acct, 2)
	tok1, tok2 := issueToken(t, adm, inst1), issueToken(t, adm, inst2)
	// Each instance through both gateways: the pauses are set through A.
	c1 := []*client.Client{gwA.Client(t, tok1), gwB.Client(t, tok1)}
	c2 := []*client.Client{gwA.Client(t, tok2), gwB.Client(t, tok2)}
	actor := "e2e-admin:" + cfg.AdminToken[:8]

	released := func(c *client.Client, w *protocol.Workspace) {
		t.Helper()
		if _, err := c.Release(ctx, w.WorkspaceID); err != nil {
			t.Fatalf("Release %s: %v", w.WorkspaceID, err)
		}
	}
	n := 0
	key := func() string { n++; return fmt.Sprintf("pause-%03d", n) }

	running := acquire(t, c1[0], key())
	if out := strings.TrimSpace(runCLI(t, env, "admin", "pause", "--instance", inst1, "--reason", "maintenance", "--note", "disk swap")); out != "terminated=1 failed=0" {
		t.Fatalf("pause --instance printed %q; want terminated=1 failed=0", out)
	}
	if got, err := c1[1].Workspace(ctx, running.WorkspaceID); err != nil || got.State != "terminated" ||
		got.TerminationReason == nil || *got.TerminationReason != "paused" {
		t.Fatalf("the paused instance's workspace = %s, %v; want terminated, paused", mustJSON(t, got), err)
	}
	for i := range 2 {
		wantRefused(t, fmt.Sprintf("gateway %d: the paused instance", i), c1[i], key(), http.StatusForbidden, protocol.Paused, "maintenance")
		w := acquire(t, c2[i], key()) // its sibling still admits
		released(c2[i], w)
	}
	sibling := acquire(t, c2[1], key())

	if out := strings.TrimSpace(runCLI(t, env, "admin", "pause", "--account", acct, "--reason", "payment")); out != "terminated=1 failed=0" {
		t.Fatalf("pause --account printed %q; want terminated=1 failed=0", out)
	}
	for i := range 2 {
		// The account's pause is checked before the instance's.
		wantRefused(t, fmt.Sprintf("gateway %d: instance 1, account paused", i), c1[i], key(), http.StatusForbidden, protocol.Paused, "payment")
		wantRefused(t, fmt.Sprintf("gateway %d: instance 2, account paused", i), c2[i], key(), http.StatusForbidden, protocol.Paused, "payment")
		l, err := c2[i].Lease(ctx)
		if err != nil || l.Admission.State != protocol.AdmissionPaused || l.Admission.Reason != "payment" {
			t.Fatalf("gateway %d: Lease of instance 2, account paused = %+v, %v; want paused, payment", i, l, err)
		}
	}
	if got, err := c2[0].Workspace(ctx, sibling.WorkspaceID); err != nil || got.State != "terminated" {
		t.Fatalf("instance 2's workspace after the account's pause = %s, %v; want terminated", mustJSON(t, got), err)
	}

	// status, while both pauses hold: table and JSON.
	table := runCLI(t, env, "admin", "status")
	for _, want := range []struct{ scope, reason string }{
		{"instance " + inst1 + " (" + acct + ")", "maintenance"},
		{"account " + acct, "payment"},
	} {
		found := false
		for _, line := range strings.Split(table, "\n") {
			if strings.HasPrefix(line, want.scope+" ") && strings.Contains(line, " pause ") &&
				strings.Contains(line, " "+want.reason+" ") && strings.Contains(line, " "+actor+" ") {
				found = true
			}
		}
		if !found {
			t.Errorf("admin status lacks a row for %s: pause, %s, %s:\n%s", want.scope, want.reason, actor, table)
		}
	}
	var st adminapi.Status
	if err := json.Unmarshal([]byte(runCLI(t, env, "admin", "status", "-o", "json")), &st); err != nil {
		t.Fatalf("admin status -o json: %v", err)
	}
	if st.BrokerStop != nil || len(st.Controls) != 2 {
		t.Fatalf("admin status -o json = %s; want the two pauses and no stop", mustJSON(t, st))
	}
	for _, c := range st.Controls {
		if c.AccountID != acct || c.Kind != "pause" || c.Actor != actor || !c.Active || c.Since == "" ||
			(c.InstanceID == inst1) != (c.Reason == "maintenance") || (c.InstanceID == "") != (c.Reason == "payment") {
			t.Errorf("admin status control %s; want the pauses of %s (maintenance) and %s (payment) by %s", mustJSON(t, c), inst1, acct, actor)
		}
	}

	// Resuming the instance alone leaves the account's pause in force.
	if out := strings.TrimSpace(runCLI(t, env, "admin", "resume", "--instance", inst1)); out != "resumed" {
		t.Fatalf("resume --instance printed %q; want resumed", out)
	}
	for i := range 2 {
		wantRefused(t, fmt.Sprintf("gateway %d: instance 1 resumed, account paused", i), c1[i], key(), http.StatusForbidden, protocol.Paused, "payment")
	}
	runCLI(t, env, "admin", "resume", "--account", acct)
	for i := range 2 {
		for _, c := range [][]*client.Client{c1, c2} {
			w := acquire(t, c[i], key())
			released(c[i], w)
		}
	}
	if out := strings.TrimSpace(runCLI(t, env, "admin", "status")); out != "nothing is stopped or paused" {
		t.Errorf("admin status after both resumes printed %q; want nothing is stopped or paused", out)
	}

	// An account's stop, on and off, for the audit.
	runCLI(t, env, "admin", "stop", "on", "--account", acct, "--reason", "operator")
	for i := range 2 {
		wantRefused(t, fmt.Sprintf("gateway %d: account stopped", i), c2[i], key(), http.StatusForbidden, protocol.EmergencyStopped, "operator")
	}
	runCLI(t, env, "admin", "stop", "off", "--account", acct)
	released(c2[0], acquire(t, c2[0], key()))

	audit := runCLI(t, env, "admin", "audit")
	for name, secret := range map[string]string{"admin": cfg.AdminToken, "operator": cfg.OpToken} {
		// The prefix is eight characters of the token; the rest must never show.
		if strings.Contains(audit, secret[8:]) {
			t.Errorf("the audit export contains the %s operator token", name)
		}
	}
	type entry struct {
		Actor, Role, Action, Target string
		Outcome                     struct{ Status int }
	}
	var got []entry
	sc := bufio.NewScanner(strings.NewReader(audit))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit line %q is not JSON: %v", sc.Text(), err)
		}
		got = append(got, e)
	}
	want := []struct{ action, target string }{
		{"pause", "instance:" + inst1},
		{"pause", "account:" + acct},
		{"resume", "instance:" + inst1},
		{"resume", "account:" + acct},
		{"stop.on", "account:" + acct},
		{"stop.off", "account:" + acct},
	}
	next := 0
	for _, e := range got {
		if next < len(want) && e.Action == want[next].action && e.Target == want[next].target {
			if e.Actor != actor || e.Role != "admin" || e.Outcome.Status != http.StatusOK {
				t.Errorf("audit entry %s %s: actor %q, role %q, status %d; want %q, admin, 200",
					e.Action, e.Target, e.Actor, e.Role, e.Outcome.Status, actor)
			}
			next++
		}
	}
	if next != len(want) {
		t.Fatalf("the audit export lacks %s %s (in order, from %d entries):\n%s", want[next].action, want[next].target, len(got), audit)
	}
}
