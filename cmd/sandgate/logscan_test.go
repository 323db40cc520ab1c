//go:build linux

package main

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/token"
)

// TestNoSecretsInLogs runs a full session against `sandgate serve`, with
// secrets planted in every place the spec says must never be logged (the
// token, argv, env values, stdin, paths, file contents), successful and
// failing requests alike, then greps everything the broker process wrote.
//
// It uses serve rather than dev on purpose: dev prints BROKER_TOKEN to
// stdout by design (that is how a developer gets it), so a dev run could
// only be scanned for the token on stderr. serve prints no token anywhere,
// so here its whole stdout and stderr are scanned for every secret. The
// log level is debug, so the most talkative lines are covered too. Tracing
// is on, exported over OTLP to an in-test receiver, and every exported
// span (names, attributes, events, status, resource) is scanned too.
func TestNoSecretsInLogs(t *testing.T) {
	t.Parallel()
	testNoSecretsInLogs(t, serveOptions{LogLevel: "debug"}, nil, nil)
}

// TestNoSecretsInLogsModal is TestNoSecretsInLogs with the instance on
// the Modal provider (against the fake Modal): the Modal credentials are
// planted secrets too.
func TestNoSecretsInLogsModal(t *testing.T) {
	t.Parallel()
	fake, env := startModal(t)
	o := serveOptions{LogLevel: "debug", Providers: modalServe}
	testNoSecretsInLogs(t, o, env, map[string]string{"the Modal token secret": modalTokenSecret, "the Modal token id": modalTokenID})
	if len(fake.Sandboxes()) == 0 {
		t.Error("the session ran no sandbox on Modal")
	}
}

func testNoSecretsInLogs(t *testing.T, o serveOptions, env []string, more map[string]string) {
	ctx := context.Background()
	rs := startRedis(t)
	cfg := newServeConfig(t, rs.Addr, o)
	recv := startOTLP(t)
	s := startServeEnv(t, cfg, append(env, recv.Env()...)...)
	adm, inst := newAccountInstance(t, s, "e2e-logscan", 2)
	tok := issueToken(t, adm, inst)

	// rnd is in every planted secret and nowhere else: no label, key or
	// id of this test carries it, so any occurrence in the logs is a leak.
	rnd := randHex(10)
	var (
		secArgv    = "SECRET-ARGV-" + rnd
		secEnv     = "SECRET-ENV-" + rnd
		secStdin   = "SECRET-STDIN-" + rnd
		secDir     = "/workspace/SECRET-PATH-" + rnd
		secPath    = secDir + "/f"
		secContent = "SECRET-CONTENT-" + rnd
		// A well-formed token the broker never issued, and a malformed one.
		unknownTok   = token.New(token.Prefix).Reveal()
		malformedTok = "sgt_SECRET-TOKEN-" + rnd
	)
	c := s.Client(t, tok)

	if _, err := c.Lease(ctx); err != nil {
		t.Fatalf("Lease: %v", err)
	}
	req := protocol.AcquireRequest{Label: "logscan", Egress: noEgress(), Env: map[string]string{"SG_SECRET": secEnv}}
	ws, _, err := c.Acquire(ctx, "logscan-1", req)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	id := ws.WorkspaceID

	// Failing acquires: a bad env key (with a secret value), and a
	// conflicting reuse of the key with another secret value.
	_, _, err = c.Acquire(ctx, "logscan-bad-env", protocol.AcquireRequest{Label: "logscan", Egress: noEgress(),
		Env: map[string]string{"bad-key": secEnv}})
	wantCode(t, "Acquire with a bad env key", err, http.StatusBadRequest, protocol.InvalidRequest)
	conflict := req
	conflict.Env = map[string]string{"SG_SECRET": secEnv + "-other"}
	_, _, err = c.Acquire(ctx, "logscan-1", conflict)
	wantCode(t, "Acquire reusing the key", err, http.StatusConflict, protocol.IdempotencyConflict)

	// Execs: argv, env and stdin come back in the output, and only there.
	res, err := c.Exec(ctx, id, protocol.ExecRequest{
		Argv:     []string{"sh", "-c", `echo "$1"; echo "$SG_SECRET"; cat`, "sh", secArgv},
		StdinB64: base64.StdEncoding.EncodeToString([]byte(secStdin)),
	})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if out := b64(t, res.StdoutB64); out != secArgv+"\n"+secEnv+"\n"+secStdin {
		t.Fatalf("Exec printed %q; want argv, env and stdin back", out)
	}
	failing := []protocol.ExecRequest{
		{Argv: []string{secArgv}},                                            // no such command
		{Argv: []string{"ls", secDir}},                                       // fails, names the path on stderr
		{Argv: []string{"true"}, Dir: secDir},                                // no such working directory
		{Argv: []string{"true"}, Dir: "SECRET-PATH-" + rnd},                  // relative dir: 400
		{Argv: []string{"echo", secArgv + "\x00"}},                           // NUL in argv: 400
		{Argv: []string{"sh", "-c", "sleep 30", secArgv}, TimeoutSeconds: 1}, // killed by the timeout
	}
	for i, r := range failing {
		res, err := c.Exec(ctx, id, r)
		if err == nil && res.ExitCode == 0 {
			t.Errorf("failing exec %d succeeded", i)
		}
	}

	// Files: a write and read on a secret path, then the refusals.
	if err := c.WriteFile(ctx, id, secPath, []byte(secContent)); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if b, err := c.ReadFile(ctx, id, secPath); err != nil || string(b) != secContent {
		t.Fatalf("ReadFile = %q, %v; want the content written", b, err)
	}
	_, err = c.ReadFile(ctx, id, secDir+"/missing")
	wantCode(t, "ReadFile of a missing secret path", err, http.StatusNotFound, protocol.FileNotFound)
	_, err = c.ReadFile(ctx, id, secDir)
	wantCode(t, "ReadFile of a directory", err, http.StatusUnprocessableEntity, protocol.NotAFile)
	err = c.WriteFile(ctx, id, secDir, []byte(secContent))
	wantCode(t, "WriteFile over a directory", err, http.StatusUnprocessableEntity, protocol.NotAFile)
	err = c.WriteFile(ctx, id, secPath+"/under-a-file", []byte(secContent))
	wantCode(t, "WriteFile under a file", err, http.StatusUnprocessableEntity, protocol.NotAFile)
	err = c.WriteFile(ctx, id, "SECRET-PATH-"+rnd, []byte(secContent))
	wantCode(t, "WriteFile to a relative path", err, http.StatusBadRequest, protocol.InvalidRequest)
	// /usr is read-only in the sandbox: the client's mistake, a 422.
	err = c.WriteFile(ctx, id, "/usr/SECRET-PATH-"+rnd+"/f", []byte(secContent))
	wantCode(t, "WriteFile under read-only /usr", err, http.StatusUnprocessableEntity, protocol.NotAFile)
	// A name longer than the file system allows: the write fails inside
	// the sandbox in a way the provider does not classify, which the
	// gateway answers (and logs, with its whole error chain) as a 5xx.
	err = c.WriteFile(ctx, id, secDir+"/"+strings.Repeat("n", 300), []byte(secContent))
	wantCode(t, "WriteFile of a name too long", err, http.StatusBadGateway, protocol.UpstreamError)

	// Unknown and malformed tokens, and an unknown workspace.
	for _, bad := range []string{unknownTok, malformedTok} {
		_, err := s.Client(t, bad).Lease(ctx)
		wantCode(t, "Lease with a bad token", err, http.StatusUnauthorized, protocol.Unauthenticated)
	}
	_, err = c.Exec(ctx, "ws_doesnotexist", protocol.ExecRequest{Argv: []string{secArgv}})
	wantCode(t, "Exec in an unknown workspace", err, http.StatusNotFound, protocol.NotFound)

	// After release: gone, with the secrets still in the requests.
	if _, err := c.Release(ctx, id); err != nil {
		t.Fatalf("Release: %v", err)
	}
	_, err = c.Exec(ctx, id, protocol.ExecRequest{Argv: []string{secArgv}, StdinB64: base64.StdEncoding.EncodeToString([]byte(secStdin))})
	wantCode(t, "Exec after release", err, http.StatusGone, protocol.WorkspaceGone)
	_, err = c.ReadFile(ctx, id, secPath)
	wantCode(t, "ReadFile after release", err, http.StatusGone, protocol.WorkspaceGone)

	// And after revocation.
	if err := adm.Do(ctx, http.MethodPost, "/instances/"+inst+"/tokens/revoke", nil, nil); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	_, err = c.Lease(ctx)
	wantCode(t, "Lease after revoke", err, http.StatusUnauthorized, protocol.LeaseRevoked)

	// Stop the broker so that everything it would write is written.
	s.stop()
	logs := s.Logs()
	spans := recv.Raw()
	secrets := map[string]string{
		"the token":                      tok,
		"the token's secret part":        tok[12:], // token.DisplayPrefix may show the first 12
		"the unknown token":              unknownTok,
		"the malformed token":            malformedTok,
		"argv":                           secArgv,
		"an env value":                   secEnv,
		"stdin":                          secStdin,
		"stdin, base64":                  base64.StdEncoding.EncodeToString([]byte(secStdin)),
		"a path":                         "SECRET-PATH-" + rnd,
		"file contents":                  secContent,
		"file contents, base64":          base64.StdEncoding.EncodeToString([]byte(secContent)),
		"the random part of any secret":  rnd,
		"the operator token (token_env)": cfg.AdminToken,
		"the operator token (sha256)":    cfg.OpToken,
	}
	for what, secret := range more {
		secrets[what] = secret
	}
	for what, secret := range secrets {
		if i := strings.Index(logs, secret); i >= 0 {
			t.Errorf("the broker's output contains %s: …%s…", what, logs[max(0, i-200):min(len(logs), i+len(secret)+50)])
		}
		if i := strings.Index(spans, secret); i >= 0 {
			t.Errorf("an exported span contains %s: …%q…", what, spans[max(0, i-200):min(len(spans), i+len(secret)+50)])
		}
	}
	// Guard against a vacuous pass: the failing requests were logged, and
	// their spans exported.
	if n := len(recv.Spans()); n < 50 {
		t.Errorf("the receiver got %d spans; want every request's, its Redis and provider calls", n)
	}
	for _, want := range []string{"POST /v1/workspaces/:id/exec", "provider exec", "provider write_file", "provider read_file", "admission"} {
		if !strings.Contains(spans, want) {
			t.Errorf("no exported span is named %q; is tracing on?", want)
		}
	}
	for _, want := range []string{`"msg":"request failed"`, `"status":400`, `"status":401`, `"status":404`, `"status":409`, `"status":410`, `"status":422`, `"exec finished"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the broker's output has no %s line; is logging captured?", want)
		}
	}
}
