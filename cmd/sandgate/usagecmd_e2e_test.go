package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/token"
)

// TestUsageSummaryAndStatementCLI runs `sandgate usage summary` and
// `sandgate usage statement` with the dev broker's finance token, in their
// table and JSON forms, and the tables of `admin account list`.
func TestUsageSummaryAndStatementCLI(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	c := d.Client(t, "")
	ws := acquire(t, c, "usage-cli-"+randHex(8))
	if _, err := c.Release(context.Background(), ws.WorkspaceID); err != nil {
		t.Fatal(err)
	}
	var accts []adminapi.Account
	if err := json.Unmarshal([]byte(runCLI(t, d.AdminEnv(), "admin", "account", "list", "-o", "json")), &accts); err != nil || len(accts) != 1 {
		t.Fatalf("account list = %v, %v; want the dev account", accts, err)
	}
	acct := accts[0].ID
	if out := runCLI(t, d.AdminEnv(), "admin", "account", "list"); !strings.HasPrefix(out, "ID ") || !strings.Contains(out, acct+"  dev ") {
		t.Errorf("account list =\n%s\nwant a header and %s dev", out, acct)
	}
	fin := []string{"SANDGATE_ADMIN_URL=" + d.AdminURL, "SANDGATE_ADMIN_TOKEN=" + d.env["FINANCE_TOKEN"]}

	out := runCLI(t, fin, "usage", "summary", "-o", "table")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "ACCOUNT CURRENCY ENTRIES WORKSPACES SECONDS AMOUNT" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), acct+" USD 1 1 ") || !strings.HasSuffix(lines[1], " USD") ||
		!strings.HasPrefix(lines[2], "from ") {
		t.Errorf("usage summary =\n%s\nwant a header, one USD row of %s and the range", out, acct)
	}
	var sum adminapi.UsageSummary
	if err := json.Unmarshal([]byte(runCLI(t, fin, "usage", "summary", "--group-by", "size", "-o", "json")), &sum); err != nil ||
		sum.GroupBy != "size" || len(sum.Groups) != 1 || sum.Groups[0].Key != "standard" || sum.Groups[0].Workspaces != 1 {
		t.Errorf("usage summary --group-by size -o json = %+v, %v; want one standard group of 1 workspace", sum, err)
	}

	out = runCLI(t, fin, "usage", "statement", "--account", acct)
	norm := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"account " + acct + ", ", "LINE AMOUNT opening balance 0.00 USD", "credits and debits 100.00 USD",
		"closing balance 100.00 USD", "unexplained 0.00 USD"} {
		if !strings.Contains(norm, want) {
			t.Errorf("usage statement lacks %q:\n%s", want, out)
		}
	}
	var st billing.Statement
	if err := json.Unmarshal([]byte(runCLI(t, fin, "usage", "statement", "--account", acct, "-o", "json")), &st); err != nil ||
		st.AccountID != acct || st.CreditsMicros != 100_000_000 || st.UnexplMicros != 0 || len(st.Lines) != 1 {
		t.Errorf("usage statement -o json = %+v, %v; want 100.00 credited, one usage line, nothing unexplained", st, err)
	}
	if _, stderr, err := tryCLI(fin, "usage", "statement", "--account", acct, "--month", "2026-13"); err == nil || !strings.Contains(stderr, "--month takes YYYY-MM") {
		t.Errorf("usage statement --month 2026-13 = %v, %q; want a refusal", err, stderr)
	}
}

// TestOperatorListenerServesAPIDocuments: both OpenAPI documents, without
// a token, on the operator listener of sandgate dev.
func TestOperatorListenerServesAPIDocuments(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	for _, name := range []string{"v1.json", "admin-v1.json"} {
		resp, err := http.Get(d.AdminURL + "/openapi/" + name)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			OpenAPI string         `json:"openapi"`
			Paths   map[string]any `json:"paths"`
		}
		err = json.NewDecoder(resp.Body).Decode(&doc)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" || err != nil || doc.OpenAPI != "3.1.0" || len(doc.Paths) < 10 {
			t.Errorf("GET /openapi/%s = %d %q, %v, openapi %q with %d paths; want 200 JSON of OpenAPI 3.1.0",
				name, resp.StatusCode, resp.Header.Get("Content-Type"), err, doc.OpenAPI, len(doc.Paths))
		}
	}
}

// TestOperatorTokenCommand: `sandgate operator-token` mints a token that
// a config entry of its printed SHA-256 accepts.
func TestOperatorTokenCommand(t *testing.T) {
	t.Parallel()
	stdout, stderr, err := tryCLI(nil, "operator-token", "--name", "alice", "--role", "finance")
	if err != nil {
		t.Fatalf("operator-token: %v\n%s", err, stderr)
	}
	tok := strings.TrimSpace(stdout)
	if !strings.HasPrefix(tok, "sgo_") || len(tok) < 40 {
		t.Fatalf("operator-token printed %q; want an sgo_ token", tok)
	}
	want := "  - name: alice\n    role: finance\n    token_sha256: \"" + token.Hash(sandgate.Secret(tok)) + "\"\n"
	if !strings.HasSuffix(stderr, want) || strings.Contains(stderr, tok) {
		t.Errorf("operator-token stderr = %q; want the config entry %q and never the token", stderr, want)
	}
	if _, _, err := tryCLI(nil, "operator-token", "--name", "x", "--role", "root"); err == nil {
		t.Error("operator-token --role root succeeded; want a refusal")
	}
}
