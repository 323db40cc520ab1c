//go:build linux

package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/token"
)

// TestTwoGatewaysConcurrency: two gateways over one Redis admit exactly
// max_concurrent_workspaces workspaces of an instance between them, however
// many acquires race, and release every slot they took.
func TestTwoGatewaysConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs, cfg, gwA, gwB := startPair(t)

	const limit, racers = 3, 120
	adm := gwA.Admin(t)
	acct := createAccount(t, adm, "e2e-concurrency")
	inst := createInstance(t, adm, acct, limit)
	tok := issueToken(t, adm, inst)
	clients := warmClients(ctx, t, tok, gwA, gwB)

	won := wantConcurrencySplit(t, raceAcquires(ctx, clients, "race", racers), limit)

	releaseCrosswise(ctx, t, clients, won)

	// Nothing leaked: the full limit is available again, and no more.
	again := raceAcquires(ctx, clients, "again", limit+1)
	won = won[:0]
	for i, r := range again {
		switch {
		case r.err == nil:
			won = append(won, r)
		case client.CodeOf(r.err) != protocol.ConcurrencyLimit:
			t.Fatalf("acquire %d after releasing: %v", i, r.err)
		}
	}
	if len(won) != limit {
		t.Fatalf("after releasing everything, %d of %d acquires succeeded; want %d", len(won), limit+1, limit)
	}
	for _, r := range won {
		if _, err := clients[r.gw].Release(ctx, r.ws.WorkspaceID); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}

	liveKey := "sg:{" + acct + "}:inst:" + inst + ":live"
	if n, err := rs.Client().ZCard(ctx, liveKey).Result(); err != nil || n != 0 {
		t.Fatalf("ZCARD %s = %d, %v; want 0 once everything is released", liveKey, n, err)
	}
	wantNoLocalWorkspaces(t, cfg.DataDir)
}

// warmClients returns a client of tok for each gateway, each of which has
// read the lease once: the gateways' auth caches and the connections are
// warm before a race.
func warmClients(ctx context.Context, t *testing.T, tok string, gws ...*serveBroker) []*client.Client {
	t.Helper()
	clients := make([]*client.Client, len(gws))
	for i, gw := range gws {
		clients[i] = gw.Client(t, tok)
		if _, err := clients[i].Lease(ctx); err != nil {
			t.Fatalf("Lease: %v", err)
		}
	}
	return clients
}

// releaseCrosswise releases each won workspace through the gateway that
// did not create it (of two), and fails unless it ends terminated.
func releaseCrosswise(ctx context.Context, t *testing.T, clients []*client.Client, won []raced) {
	t.Helper()
	for _, r := range won {
		rel, err := clients[1-r.gw].Release(ctx, r.ws.WorkspaceID)
		if err != nil || rel == nil || rel.State != "terminated" {
			t.Fatalf("Release %s = %+v, %v; want terminated", r.ws.WorkspaceID, rel, err)
		}
	}
}

// wantNoLocalWorkspaces fails the test unless the local provider under
// dataDir has no workspace directory left.
func wantNoLocalWorkspaces(t testing.TB, dataDir string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dataDir, "local", "workspaces"))
	if err != nil || len(entries) != 0 {
		t.Errorf("local workspace directories left: %d (%v); want none", len(entries), err)
	}
}

// TestTokenLifecycleAcrossGateways: a token change made through one
// gateway's operator API holds on the next request to the other gateway,
// even though that gateway had the token cached (pub/sub invalidation).
func TestTokenLifecycleAcrossGateways(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs, _, gwA, gwB := startPair(t)
	adm, inst := newAccountInstance(t, gwA, "e2e-lifecycle", 2)
	rdb := rs.Client()

	t.Run("Revoke", func(t *testing.T) {
		tok := issueToken(t, adm, inst)
		onB := gwB.Client(t, tok)
		ws := acquire(t, onB, "lifecycle-1")
		proveCached(t, rdb, onB, tok)

		var n struct{ Count int }
		if err := gwA.Operator(t).Do(ctx, http.MethodPost, "/instances/"+inst+"/tokens/revoke", nil, &n); err != nil || n.Count == 0 {
			t.Fatalf("revoke through gateway A = %+v, %v; want a count > 0", n, err)
		}
		_, err := onB.Workspace(ctx, ws.WorkspaceID)
		wantCode(t, "the next request on gateway B after revoke", err, http.StatusUnauthorized, protocol.LeaseRevoked)
		_, err = gwA.Client(t, tok).Lease(ctx)
		wantCode(t, "gateway A after revoke", err, http.StatusUnauthorized, protocol.LeaseRevoked)

		// spec §Credential: a new token of the instance still controls
		// its running workspaces.
		fresh := gwB.Client(t, issueToken(t, adm, inst))
		if rel, err := fresh.Release(ctx, ws.WorkspaceID); err != nil || rel == nil {
			t.Fatalf("Release with a new token after revoke = %+v, %v", rel, err)
		}
	})

	t.Run("Rotate", func(t *testing.T) {
		tok := issueToken(t, adm, inst)
		onB := gwB.Client(t, tok)
		proveCached(t, rdb, onB, tok)
		newTok := strings.TrimSpace(runCLI(t, gwA.AdminEnv(), "admin", "token", "rotate", "--instance", inst))
		lease, err := onB.Lease(ctx)
		if err != nil || lease.Lease.State != "superseded" {
			t.Fatalf("the next request on gateway B after rotate = %+v, %v; want superseded", lease, err)
		}
		runCLI(t, gwA.AdminEnv(), "admin", "token", "end-grace", "--instance", inst)
		_, err = onB.Lease(ctx)
		wantCode(t, "the next request on gateway B after end-grace", err, http.StatusUnauthorized, protocol.LeaseSuperseded)
		if _, err := gwB.Client(t, newTok).Lease(ctx); err != nil {
			t.Fatalf("the rotated-in token on gateway B: %v", err)
		}
	})

	t.Run("Expiry", func(t *testing.T) {
		issued := time.Now()
		tok := strings.TrimSpace(runCLI(t, gwA.AdminEnv(), "admin", "token", "issue", "--instance", inst, "--ttl", "2s"))
		onB := gwB.Client(t, tok)
		lease, err := onB.Lease(ctx)
		switch {
		case client.CodeOf(err) == protocol.LeaseExpired && time.Since(issued) >= 2*time.Second:
			// A loaded machine took the whole TTL to get here: nothing to
			// check before expiry.
			t.Logf("the 2s token expired before its first request")
		case err != nil || lease.Lease.State != "active" || lease.Lease.ExpiresAt == nil:
			t.Fatalf("Lease of a 2s token = %+v, %v; want active with expires_at", lease, err)
		}
		waitFor(t, "the 2s token to expire", func() (bool, error) {
			_, err := onB.Lease(ctx)
			return client.CodeOf(err) == protocol.LeaseExpired, err
		})
		_, err = onB.Lease(ctx)
		wantCode(t, "gateway B after expiry", err, http.StatusUnauthorized, protocol.LeaseExpired)
		_, err = gwA.Client(t, tok).Lease(ctx)
		wantCode(t, "gateway A after expiry", err, http.StatusUnauthorized, protocol.LeaseExpired)
	})
}

// proveCached makes sure the gateway behind c answers tok from its auth
// cache: with the token's record deleted from Redis behind the gateways'
// back (no invalidation is published), a cached gateway still answers 200.
// The record is put back before it returns. The cache is only trusted
// once the gateway's invalidation subscription is up, hence the poll.
func proveCached(t *testing.T, rdb *redis.Client, c *client.Client, tok string) {
	t.Helper()
	ctx := context.Background()
	key := "sg:token:" + token.Hash(sandgate.Secret(tok))
	rec, err := rdb.Get(ctx, key).Result()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	defer func() {
		if err := rdb.Set(ctx, key, rec, 0).Err(); err != nil {
			t.Fatalf("restore %s: %v", key, err)
		}
	}()
	waitFor(t, "the gateway to cache the token", func() (bool, error) {
		if err := rdb.Set(ctx, key, rec, 0).Err(); err != nil {
			return false, err
		}
		if _, err := c.Lease(ctx); err != nil {
			return false, err
		}
		if err := rdb.Del(ctx, key).Err(); err != nil {
			return false, err
		}
		_, err := c.Lease(ctx)
		return err == nil, err
	})
}
