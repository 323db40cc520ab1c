//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/protocol"
)

// TestBillingPropertyGatewayKill runs a seeded random sequence of credits,
// acquires, releases, reaper expiries and gateway kill -9s against two
// `sandgate serve` processes on one Redis, and checks after every step
// that money is conserved (balance + settled = credits − debits, where
// balance = available + holds), and at the end, once every hold is
// closed, that reconcile finds no drift and that every admitted workspace
// has exactly one final usage entry. SANDGATE_PROPERTY_SEED replays a seed.
func TestBillingPropertyGatewayKill(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SANDGATE_PROPERTY_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SANDGATE_PROPERTY_SEED: %v", err)
		}
		seed = n
	}
	t.Logf("seed %d (replay with SANDGATE_PROPERTY_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	ctx := context.Background()

	rd := startRedis(t)
	cfg := newServeConfig(t, rd.Addr, serveOptions{})
	// Workspaces live 3s, so the reaper expires some; the repair pass
	// runs every second instead of every minute.
	raw, err := os.ReadFile(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(string(raw), "max_lifetime: 1h", "max_lifetime: 3s", 1) + "billing:\n  repair_interval: 1s\n"
	if err := os.WriteFile(cfg.Path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	gws := []*serveBroker{startServe(t, cfg), startServe(t, cfg)}
	admin := gws[0].Admin(t)
	acct := createAccount(t, admin, "property")
	inst := createInstance(t, admin, acct, 4)
	tok := issueToken(t, admin, inst)

	cli := func(args ...string) string { return runCLI(t, gws[rng.IntN(len(gws))].AdminEnv(), args...) }
	cli("admin", "rate-card", "create", "--name", "prop", "--currency", "USD", "--small", "0.001000", "--standard", "0.002000",
		"--large", "0.004000", "--xlarge", "0.008000")
	cli("admin", "billing", "set", "--account", acct, "--rate-card", "prop", "--currency", "USD")

	var credits int64              // expected credits_micros
	keys := []string{}             // idempotency keys used
	amounts := map[string]string{} // idempotency key → amount
	admitted := map[string]bool{}  // workspace id → admitted
	var open []string              // admitted, not released by the test
	check := func(step string) {
		t.Helper()
		var b adminapi.Balance
		out := cli("admin", "funds", "balance", "--account", acct, "-o", "json")
		if err := json.Unmarshal([]byte(out), &b); err != nil {
			t.Fatalf("%s: funds balance: %v: %s", step, err, out)
		}
		if b.AvailableMicros+b.HoldsMicros+b.SettledMicros != b.CreditsMicros-b.DebitsMicros ||
			b.AvailableMicros+b.HoldsMicros != b.BalanceMicros || b.HoldsMicros < 0 || b.SettledMicros < 0 {
			t.Fatalf("%s: money not conserved: %+v (available + holds + settled ≠ credits − debits)", step, b)
		}
		if b.CreditsMicros != credits {
			t.Fatalf("%s: credits = %d µ, want %d µ (each idempotency key once)", step, b.CreditsMicros, credits)
		}
	}
	gwClient := func() *client.Client { return gws[rng.IntN(len(gws))].Client(t, tok) }

	const steps = 40
	for i := range steps {
		var step string
		switch r := rng.IntN(100); {
		case r < 22: // credit, sometimes a retry of an earlier key
			if len(keys) > 0 && rng.IntN(4) == 0 {
				k := keys[rng.IntN(len(keys))]
				step = "credit retry " + k
				// A retry (same key, same credit) applies once.
				cli("admin", "funds", "credit", "--account", acct, "--amount", amounts[k], "--reason", "property", "--idempotency-key", k)
				break
			}
			micros := int64(1+rng.IntN(10)) * 1000
			k := fmt.Sprintf("k%d", i)
			step = fmt.Sprintf("credit %d µ", micros)
			amounts[k] = fmt.Sprintf("%d.%06d", micros/1e6, micros%1e6)
			cli("admin", "funds", "credit", "--account", acct, "--amount", amounts[k], "--reason", "property", "--idempotency-key", k)
			credits += micros
			keys = append(keys, k)
		case r < 55: // acquire on a random gateway
			ws, created, err := gwClient().Acquire(ctx, fmt.Sprintf("acq-%d-%d", seed, i), protocol.AcquireRequest{Label: "property", Egress: noEgress()})
			var ce *client.Error
			switch {
			case err == nil && created:
				step = "acquire " + ws.WorkspaceID
				admitted[ws.WorkspaceID] = true
				open = append(open, ws.WorkspaceID)
			case errors.As(err, &ce) && (ce.Code == protocol.InsufficientFunds || ce.Code == protocol.ConcurrencyLimit):
				step = "acquire refused " + string(ce.Code)
			default:
				t.Fatalf("step %d: acquire: created %v, err %v", i, created, err)
			}
		case r < 75: // release a random open workspace
			if len(open) == 0 {
				step = "release (none open)"
				break
			}
			j := rng.IntN(len(open))
			id := open[j]
			open = append(open[:j], open[j+1:]...)
			step = "release " + id
			if _, err := gwClient().Release(ctx, id); err != nil {
				var ce *client.Error
				// The reaper may have ended it already.
				if !errors.As(err, &ce) || ce.Status >= 500 {
					t.Fatalf("step %d: release %s: %v", i, id, err)
				}
				step += " (already ended: " + string(ce.Code) + ")"
			}
		case r < 88: // let workspaces run into their max lifetime
			d := time.Duration(500+rng.IntN(1500)) * time.Millisecond
			step = "wait " + d.String()
			time.Sleep(d)
		default: // kill -9 a random gateway and start a replacement
			j := rng.IntN(len(gws))
			step = fmt.Sprintf("kill -9 gateway %d", j)
			gws[j].kill()
			gws[j] = startServe(t, cfg)
		}
		t.Logf("step %d: %s", i, step)
		check(fmt.Sprintf("step %d (%s)", i, step))
	}

	// Release what is still open, then wait for the reaper (expiries,
	// workspaces of killed gateways) and the repair pass to close every hold.
	for _, id := range open {
		if _, err := gwClient().Release(ctx, id); err != nil {
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Status >= 500 {
				t.Fatalf("final release %s: %v", id, err)
			}
		}
	}
	// A backstop of a minute: the passes run every second or two, but
	// each check here starts a CLI process, and all of it is slow on a
	// loaded machine.
	deadline := time.Now().Add(pollTimeout)
	for {
		var b struct {
			HoldsMicros int64 `json:"holds_micros"`
		}
		out := cli("admin", "funds", "balance", "--account", acct, "-o", "json")
		if err := json.Unmarshal([]byte(out), &b); err != nil {
			t.Fatal(err)
		}
		if b.HoldsMicros == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("holds still open %v after the last release: %s", pollTimeout, out)
		}
		time.Sleep(250 * time.Millisecond)
	}
	check("final")
	if out := cli("usage", "reconcile", "--account", acct); !strings.Contains(out, acct+" ok") {
		t.Fatalf("reconcile: %s", out)
	}

	// Every admitted workspace exactly once in the usage ledger, with a
	// final entry; nothing else.
	now := time.Now().UTC()
	out := cli("usage", "export", "--format", "jsonl", "--account", acct,
		"--from", now.Add(-24*time.Hour).Format(time.RFC3339), "--to", now.Add(time.Hour).Format(time.RFC3339))
	finals := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			ID          string `json:"id"`
			WorkspaceID string `json:"workspace_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("usage export line %q: %v", sc.Text(), err)
		}
		if !admitted[e.WorkspaceID] {
			t.Errorf("usage entry %s: workspace %s was never admitted", e.ID, e.WorkspaceID)
		}
		if e.ID == e.WorkspaceID+":final" {
			finals[e.WorkspaceID]++
		}
	}
	for id := range admitted {
		if finals[id] != 1 {
			t.Errorf("workspace %s: %d final usage entries, want exactly 1", id, finals[id])
		}
	}
	t.Logf("%d workspaces admitted, %d µ credited", len(admitted), credits)
}
