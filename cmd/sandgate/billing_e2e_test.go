//go:build linux

package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/broker"
)

// TestE2EDevBilling drives billing through the binary on `sandgate dev`:
// the dev account starts funded, a workspace's hold and settlement move
// its balance, operator credits apply once per idempotency key, and
// reconcile finds no drift.
func TestE2EDevBilling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := startDev(t)
	raw, err := os.ReadFile(filepath.Join(d.dataDir, "dev.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st broker.DevState
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	env := d.AdminEnv()
	balance := func() string {
		return strings.TrimSpace(runCLI(t, env, "admin", "funds", "balance", "--account", st.AccountID))
	}
	if got := balance(); got != broker.DevFunds {
		t.Fatalf("dev account's opening balance = %q, want %q", got, broker.DevFunds)
	}
	c := d.Client(t, "")
	ws := acquire(t, c, "billing-1")
	if got := balance(); got == broker.DevFunds {
		t.Fatalf("balance with a workspace open = %q: no hold", got)
	}
	if _, err := c.Release(ctx, ws.WorkspaceID); err != nil {
		t.Fatalf("release: %v", err)
	}
	for range 2 {
		runCLI(t, env, "admin", "funds", "credit", "--account", st.AccountID, "--amount", "5.00", "--reason", "e2e", "--idempotency-key", "k1")
	}
	var b struct {
		Holds    string `json:"holds"`
		Settled  string `json:"settled"`
		Credits  string `json:"credits"`
		Currency string `json:"currency"`
	}
	if err := json.Unmarshal([]byte(runCLI(t, env, "admin", "funds", "balance", "--account", st.AccountID, "-o", "json")), &b); err != nil {
		t.Fatal(err)
	}
	if b.Holds != "0.00" || b.Credits != "105.00" || b.Currency != "USD" {
		t.Fatalf("after release and a credit sent twice: %+v; want holds 0.00, credits 105.00, USD", b)
	}
	out := runCLI(t, env, "usage", "reconcile", "--account", st.AccountID)
	if !strings.Contains(out, st.AccountID+" ok") {
		t.Fatalf("reconcile: %s", out)
	}
}
