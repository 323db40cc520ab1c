// Package conformance runs the protocol v1 client checklist against a
// running broker, sandgate or any other implementation: a disposable
// workspace is acquired, used and released, and the broker's refusals of
// bad requests are checked by status and code. `sandgate conformance`
// prints its results; the e2e suite runs it against every provider.
package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/protocol"
)

// Config says which broker to check and how. A zero field means the
// default noted beside it.
type Config struct {
	// URL is the broker's base URL (https). Required.
	URL string
	// Token is an instance token of the broker. Required. The checks
	// acquire at most one workspace at a time and leave none behind.
	Token sandgate.Secret
	// RootCAs verifies the broker's certificate; nil means the system pool.
	RootCAs *x509.CertPool
	// HTTPClient carries every request, as client.Config.HTTPClient does;
	// nil means one built with RootCAs. Tests wrap its transport to see
	// every answer.
	HTTPClient *http.Client
	// AllowedDomain, when set, is allowed to the workspace, and a fetch of
	// https://AllowedDomain/ from inside it must connect; it may carry a
	// :port, used for the fetch only. Empty skips the egress checks.
	AllowedDomain string
	// DeniedDomain is fetched the same way and must be refused; empty
	// means example.com (on AllowedDomain's port). Used only with
	// AllowedDomain.
	DeniedDomain string
	// Poll is how long to wait between reads of a workspace that is
	// starting or a command that runs; 0 means 200ms.
	Poll time.Duration
	// Wait bounds each wait for a state; 0 means 2 minutes.
	Wait time.Duration
}

// Result is the outcome of one check.
type Result struct {
	Name string `json:"name"`
	// OK is false for a failed or skipped check.
	OK bool `json:"ok"`
	// Skipped is set, with Error saying why, for a check that did not run.
	Skipped bool `json:"skipped,omitempty"`
	// Error says why the check failed or was skipped.
	Error string `json:"error,omitempty"`
	// Status is the HTTP status of the refusal that failed the check; 0
	// when there was none.
	Status int `json:"status,omitempty"`
	// Transport is set when the check failed without an answer from the
	// broker (it could not be reached, or the connection broke).
	Transport bool          `json:"transport,omitempty"`
	Duration  time.Duration `json:"-"`
	// DurationMS is Duration in milliseconds, for -o json.
	DurationMS int64 `json:"duration_ms"`
}

// Failed reports whether any result is a failure (skips are not).
func Failed(rs []Result) bool {
	for _, r := range rs {
		if !r.OK && !r.Skipped {
			return true
		}
	}
	return false
}

// Unavailable reports whether the broker could not be used at all: its
// lease, the first check, got no answer or a 5xx.
func Unavailable(rs []Result) bool {
	for _, r := range rs {
		if r.Name == "lease" {
			return !r.OK && (r.Transport || r.Status >= 500)
		}
	}
	return false
}

// Run runs every check in order and calls report with each result as it
// is known (nil: none). It returns the results; an error only for a
// Config it cannot use.
func Run(ctx context.Context, cfg Config, report func(Result)) ([]Result, error) {
	hc := cfg.HTTPClient
	if hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		if cfg.RootCAs != nil {
			t.TLSClientConfig.RootCAs = cfg.RootCAs
		}
		hc = &http.Client{Transport: t}
	}
	c, err := client.New(client.Config{Endpoint: cfg.URL, Token: cfg.Token, RootCAs: cfg.RootCAs, HTTPClient: hc,
		MaxAttempts: 3, BaseBackoff: 200 * time.Millisecond, UserAgent: "sandgate-conformance/1"})
	if err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	raw := *hc
	raw.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	r := &run{cfg: cfg, c: c, hc: &raw, base: strings.TrimRight(cfg.URL, "/"), report: report, nonce: nonce()}
	if r.cfg.Poll == 0 {
		r.cfg.Poll = 200 * time.Millisecond
	}
	if r.cfg.Wait == 0 {
		r.cfg.Wait = 2 * time.Minute
	}
	r.all(ctx)
	return r.results, nil
}

// run is one run's state: what earlier checks made for later ones.
type run struct {
	cfg     Config
	c       *client.Client
	hc      *http.Client
	base    string
	report  func(Result)
	nonce   string
	results []Result

	ws, snap string // the workspace and the snapshot, once made
	acqKey   string // the Acquire's Idempotency-Key
}

// Paths the checks use inside a workspace.
const (
	dir      = "/workspace/sandgate-conformance"
	file     = dir + "/hello.txt"
	contents = "hello from sandgate conformance\n"
)

func (r *run) all(ctx context.Context) {
	var lease *protocol.LeaseResponse
	if !r.check(ctx, "lease", func(ctx context.Context) error {
		var err error
		if lease, err = r.c.Lease(ctx); err != nil {
			return err
		}
		if lease.APIVersion != protocol.APIVersion {
			return fmt.Errorf("api_version %q, want %q", lease.APIVersion, protocol.APIVersion)
		}
		if lease.Admission.State != protocol.AdmissionOpen {
			return fmt.Errorf("admission %q (%s): nothing can be acquired", lease.Admission.State, lease.Admission.Reason)
		}
		return nil
	}) {
		r.skipRest("the lease check failed")
		return
	}
	r.refusals(ctx)
	if !r.check(ctx, "acquire", r.acquire) {
		r.skipRest("no workspace was acquired")
		return
	}
	r.check(ctx, "status", func(ctx context.Context) error {
		ws, err := r.c.Workspace(ctx, r.ws)
		if err != nil {
			return err
		}
		if ws.State != "running" {
			return fmt.Errorf("state %q, want running", ws.State)
		}
		live, err := r.c.ListWorkspaces(ctx, "live", "", 100)
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		for _, w := range live.Workspaces {
			if w.WorkspaceID == r.ws {
				return nil
			}
		}
		return fmt.Errorf("GET /v1/workspaces does not list %s", r.ws)
	})
	r.check(ctx, "exec", r.exec)
	r.check(ctx, "files", r.files)
	r.check(ctx, "command", r.command)
	r.check(ctx, "command-cancel", r.cancel)
	snapped := r.check(ctx, "snapshot", func(ctx context.Context) error {
		s, created, err := r.c.Snapshot(ctx, r.ws, "conformance-snap-"+r.nonce, dir)
		if err != nil {
			return err
		}
		if !created || s.SnapshotID == "" {
			return fmt.Errorf("created %v, id %q: want a new snapshot", created, s.SnapshotID)
		}
		r.snap = s.SnapshotID
		return nil
	})
	if r.cfg.AllowedDomain != "" {
		r.check(ctx, "egress-allowed", func(ctx context.Context) error { return r.fetch(ctx, r.cfg.AllowedDomain, true) })
		r.check(ctx, "egress-denied", func(ctx context.Context) error { return r.fetch(ctx, r.deniedDomain(), false) })
	} else {
		r.skip("egress-allowed", "no allowed domain given")
		r.skip("egress-denied", "no allowed domain given")
	}
	released := r.check(ctx, "release", r.release)
	if released {
		r.check(ctx, "workspace-gone", func(ctx context.Context) error {
			_, err := r.c.Exec(ctx, r.ws, protocol.ExecRequest{Argv: []string{"true"}})
			return wantCode(err, http.StatusGone, protocol.WorkspaceGone)
		})
	} else {
		r.skip("workspace-gone", "the release failed")
	}
	if snapped && released {
		r.check(ctx, "warm-start", r.warmStart)
	} else {
		r.skip("warm-start", "no snapshot, or the first workspace is still live")
	}
	if snapped {
		r.check(ctx, "delete-snapshot", func(ctx context.Context) error {
			if err := r.c.DeleteSnapshot(ctx, r.snap); err != nil {
				return err
			}
			_, _, err := r.c.Acquire(ctx, "conformance-gone-"+r.nonce, protocol.AcquireRequest{Label: "conformance",
				Egress: &protocol.Egress{AllowedDomains: []string{}}, SnapshotID: r.snap})
			if code := client.CodeOf(err); code != protocol.SnapshotGone && code != protocol.NotFound {
				return fmt.Errorf("a warm start from the deleted snapshot: %v; want 410 snapshot_gone or 404 not_found", orNil(err))
			}
			return nil
		})
	} else {
		r.skip("delete-snapshot", "no snapshot")
	}
}

// check runs one check and records its result; it reports whether it
// passed.
func (r *run) check(ctx context.Context, name string, f func(context.Context) error) bool {
	start := time.Now()
	err := f(ctx)
	res := Result{Name: name, OK: err == nil, Duration: time.Since(start)}
	res.DurationMS = res.Duration.Milliseconds()
	if err != nil {
		res.Error = describe(err)
		var ce *client.Error
		if errors.As(err, &ce) {
			res.Status = ce.Status
		}
		var ne net.Error
		res.Transport = errors.As(err, &ne)
	}
	r.add(res)
	return err == nil
}

func (r *run) skip(name, why string) { r.add(Result{Name: name, Skipped: true, Error: why}) }

func (r *run) add(res Result) {
	r.results = append(r.results, res)
	if r.report != nil {
		r.report(res)
	}
}

// skipRest records every check after a failure that leaves them nothing
// to work on.
func (r *run) skipRest(why string) {
	done := map[string]bool{}
	for _, res := range r.results {
		done[res.Name] = true
	}
	for _, n := range Checks {
		if !done[n] {
			r.skip(n, why)
		}
	}
}

// Checks are the names of the checks, in the order they run.
var Checks = []string{"lease",
	"error-unauthenticated", "error-bad-token", "error-bad-json", "error-unknown-field", "error-idempotency-key-missing",
	"error-egress-required", "error-unknown-workspace", "error-unknown-snapshot",
	"acquire", "status", "exec", "files", "command", "command-cancel", "snapshot", "egress-allowed", "egress-denied",
	"release", "workspace-gone", "warm-start", "delete-snapshot"}

// describe is an error's one-line text; a broker's refusal by its status,
// code, message and request id.
func describe(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Error()
	}
	return err.Error()
}

func (r *run) acquire(ctx context.Context) error {
	allowed := []string{}
	if r.cfg.AllowedDomain != "" {
		allowed = []string{hostOf(r.cfg.AllowedDomain)}
	}
	r.acqKey = "conformance-" + r.nonce
	ws, created, err := r.c.Acquire(ctx, r.acqKey, protocol.AcquireRequest{Label: "sandgate-conformance",
		Egress: &protocol.Egress{AllowedDomains: allowed}})
	if err != nil {
		return err
	}
	r.ws = ws.WorkspaceID
	if !created {
		return fmt.Errorf("a fresh Idempotency-Key answered 200 (a replay), want 201")
	}
	// A replay with the same key and body answers the same workspace.
	again, created, err := r.c.Acquire(ctx, r.acqKey, protocol.AcquireRequest{Label: "sandgate-conformance",
		Egress: &protocol.Egress{AllowedDomains: allowed}})
	if err != nil {
		return fmt.Errorf("the replay: %w", err)
	}
	if created || again.WorkspaceID != ws.WorkspaceID {
		return fmt.Errorf("the replay answered %s (created %v), want %s with 200", again.WorkspaceID, created, ws.WorkspaceID)
	}
	if err := r.waitRunning(ctx, r.ws); err != nil {
		return err
	}
	// The same key with another body is a conflict.
	_, _, err = r.c.Acquire(ctx, r.acqKey, protocol.AcquireRequest{Label: "sandgate-conformance-other",
		Egress: &protocol.Egress{AllowedDomains: allowed}})
	if err := wantCode(err, http.StatusConflict, protocol.IdempotencyConflict); err != nil {
		return fmt.Errorf("the key reused with another label: %w", err)
	}
	return nil
}

// waitRunning waits until workspace id is running.
func (r *run) waitRunning(ctx context.Context, id string) error {
	return r.poll(ctx, func() (bool, error) {
		ws, err := r.c.Workspace(ctx, id)
		if err != nil {
			return false, err
		}
		switch ws.State {
		case "running":
			return true, nil
		case "starting":
			return false, nil
		}
		return false, fmt.Errorf("workspace %s is %s (%v), want running", id, ws.State, deref(ws.TerminationReason))
	})
}

// poll calls f every Config.Poll until it is done or fails, for at most
// Config.Wait.
func (r *run) poll(ctx context.Context, f func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Wait)
	defer cancel()
	tick := time.NewTicker(r.cfg.Poll)
	defer tick.Stop()
	for {
		if done, err := f(); done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still waiting after %s: %w", r.cfg.Wait, ctx.Err())
		case <-tick.C:
		}
	}
}

func (r *run) exec(ctx context.Context) error {
	res, err := r.c.Exec(ctx, r.ws, protocol.ExecRequest{Argv: []string{"echo", "conformance"}})
	if err != nil {
		return err
	}
	if out := decode(res.StdoutB64); res.ExitCode != 0 || out != "conformance\n" || res.StdoutTruncated {
		return fmt.Errorf("echo conformance: exit %d, stdout %q (truncated %v); want 0 and %q", res.ExitCode, out, res.StdoutTruncated, "conformance\n")
	}
	// A non-zero exit is a result, stdin reaches the command.
	res, err = r.c.Exec(ctx, r.ws, protocol.ExecRequest{Argv: []string{"sh", "-c", "cat; exit 3"},
		StdinB64: base64.StdEncoding.EncodeToString([]byte("in"))})
	if err != nil {
		return err
	}
	if out := decode(res.StdoutB64); res.ExitCode != 3 || out != "in" {
		return fmt.Errorf("sh -c 'cat; exit 3' with stdin %q: exit %d, stdout %q; want 3 and the stdin", "in", res.ExitCode, out)
	}
	return nil
}

func (r *run) files(ctx context.Context) error {
	if err := r.c.WriteFile(ctx, r.ws, file, []byte(contents)); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	b, err := r.c.ReadFile(ctx, r.ws, file)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if string(b) != contents {
		return fmt.Errorf("read back %q, want %q", b, contents)
	}
	_, err = r.c.ReadFile(ctx, r.ws, dir+"/missing")
	if err := wantCode(err, http.StatusNotFound, protocol.FileNotFound); err != nil {
		return fmt.Errorf("a missing file: %w", err)
	}
	_, err = r.c.ReadFile(ctx, r.ws, dir)
	if err := wantCode(err, http.StatusUnprocessableEntity, protocol.NotAFile); err != nil {
		return fmt.Errorf("a directory: %w", err)
	}
	return nil
}

func (r *run) command(ctx context.Context) error {
	id := "conformance-cmd-" + r.nonce
	req := protocol.ExecRequest{Argv: []string{"sh", "-c", "echo durable; echo oops >&2"}}
	if _, launched, err := r.c.StartCommand(ctx, r.ws, id, req); err != nil || !launched {
		return fmt.Errorf("start: launched %v, %v; want 202", launched, orNil(err))
	}
	st, err := r.waitCommand(ctx, id, protocol.CommandCompleted)
	if err != nil {
		return err
	}
	if out, errOut := decode(st.StdoutB64), decode(st.StderrB64); st.ExitCode == nil || *st.ExitCode != 0 || out != "durable\n" || errOut != "oops\n" {
		return fmt.Errorf("completed with exit %v, stdout %q, stderr %q; want 0, %q, %q", deref(st.ExitCode), out, errOut, "durable\n", "oops\n")
	}
	// The identity is claimed once: a second PUT launches nothing.
	if _, launched, err := r.c.StartCommand(ctx, r.ws, id, req); err != nil || launched {
		return fmt.Errorf("a second PUT of the identity: launched %v, %v; want 200 with the status", launched, orNil(err))
	}
	st, err = r.c.ReadCommand(ctx, r.ws, "conformance-never-started-"+r.nonce)
	if err != nil {
		return fmt.Errorf("an unknown identity: %w", err)
	}
	if st.State != protocol.CommandUnknown {
		return fmt.Errorf("an unknown identity reads %q, want unknown", st.State)
	}
	return nil
}

func (r *run) cancel(ctx context.Context) error {
	id := "conformance-cancel-" + r.nonce
	if _, _, err := r.c.StartCommand(ctx, r.ws, id, protocol.ExecRequest{Argv: []string{"sleep", "300"}}); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if err := r.c.CancelCommand(ctx, r.ws, id); err != nil {
		return fmt.Errorf("cancel: %w", err)
	}
	_, err := r.waitCommand(ctx, id, protocol.CommandCanceled)
	return err
}

// waitCommand reads command id until it reaches state, and fails on any
// other final state.
func (r *run) waitCommand(ctx context.Context, id, state string) (*protocol.CommandStatus, error) {
	var st *protocol.CommandStatus
	err := r.poll(ctx, func() (bool, error) {
		var err error
		if st, err = r.c.ReadCommand(ctx, r.ws, id); err != nil {
			return false, err
		}
		switch st.State {
		case state:
			return true, nil
		case protocol.CommandStarting, protocol.CommandRunning:
			return false, nil
		}
		return false, fmt.Errorf("command %s is %s, want %s", id, st.State, state)
	})
	return st, err
}

// fetch runs curl in the workspace against https://domain/ (certificate
// unchecked: the check is whether the broker's egress lets the connection
// through, not the site's identity) and wants it connected or refused.
func (r *run) fetch(ctx context.Context, domain string, allowed bool) error {
	res, err := r.c.Exec(ctx, r.ws, protocol.ExecRequest{Argv: []string{"curl", "-ksS", "-o", "/dev/null", "--max-time", "20",
		"https://" + domain + "/"}, TimeoutSeconds: 60})
	if err != nil {
		return err
	}
	msg := strings.TrimSpace(decode(res.StderrB64))
	switch {
	case res.ExitCode == 127:
		return errors.New("curl is not in the workspace's image: the egress checks need it")
	case allowed && res.ExitCode != 0:
		return fmt.Errorf("curl https://%s/ exited %d (%s); want it fetched", domain, res.ExitCode, msg)
	case !allowed && res.ExitCode == 0:
		return fmt.Errorf("curl https://%s/ was fetched; want the broker to refuse a domain outside the workspace's allowed_domains", domain)
	}
	return nil
}

func (r *run) deniedDomain() string {
	if r.cfg.DeniedDomain != "" {
		return r.cfg.DeniedDomain
	}
	if _, port, err := net.SplitHostPort(r.cfg.AllowedDomain); err == nil {
		return net.JoinHostPort("example.com", port)
	}
	return "example.com"
}

func (r *run) release(ctx context.Context) error {
	ws, err := r.c.Release(ctx, r.ws)
	if err != nil {
		return err
	}
	if ws.State != "terminated" && ws.State != "terminating" {
		return fmt.Errorf("state %q after release, want terminated or terminating", ws.State)
	}
	if ws.State == "terminated" && deref(ws.TerminationReason) != "released" {
		return fmt.Errorf("termination_reason %v, want released", deref(ws.TerminationReason))
	}
	// Release is idempotent.
	if _, err := r.c.Release(ctx, r.ws); err != nil {
		return fmt.Errorf("a second release: %w", err)
	}
	return nil
}

func (r *run) warmStart(ctx context.Context) error {
	ws, _, err := r.c.Acquire(ctx, "conformance-warm-"+r.nonce, protocol.AcquireRequest{Label: "sandgate-conformance-warm",
		Egress: &protocol.Egress{AllowedDomains: []string{}}, SnapshotID: r.snap})
	if err != nil {
		return err
	}
	defer func() { r.c.Release(context.WithoutCancel(ctx), ws.WorkspaceID) }()
	if err := r.waitRunning(ctx, ws.WorkspaceID); err != nil {
		return err
	}
	b, err := r.c.ReadFile(ctx, ws.WorkspaceID, file)
	if err != nil {
		return fmt.Errorf("the snapshot's file in the warm start: %w", err)
	}
	if string(b) != contents {
		return fmt.Errorf("the warm start's file holds %q, want %q", b, contents)
	}
	if _, err := r.c.Release(ctx, ws.WorkspaceID); err != nil {
		return fmt.Errorf("release the warm start: %w", err)
	}
	return nil
}

// refusals checks the broker's refusals of bad requests, each its own
// check. None creates anything.
func (r *run) refusals(ctx context.Context) {
	acquire := func(tok, key, body string) func(context.Context) (int, protocol.Code, error) {
		return func(ctx context.Context) (int, protocol.Code, error) {
			h := http.Header{}
			if key != "" {
				h.Set(protocol.HeaderIdempotencyKey, key)
			}
			return r.raw(ctx, http.MethodPost, "/v1/workspaces", tok, h, body)
		}
	}
	get := func(tok, path string) func(context.Context) (int, protocol.Code, error) {
		return func(ctx context.Context) (int, protocol.Code, error) {
			return r.raw(ctx, http.MethodGet, path, tok, nil, "")
		}
	}
	tok := r.cfg.Token.Reveal()
	valid := `{"label":"sandgate-conformance","egress":{"allowed_domains":[]}}`
	for _, c := range []struct {
		name   string
		call   func(context.Context) (int, protocol.Code, error)
		status int
		code   protocol.Code
	}{
		{"error-unauthenticated", get("", "/v1/lease"), http.StatusUnauthorized, protocol.Unauthenticated},
		{"error-bad-token", get("sgt_conformance-not-a-token-"+r.nonce, "/v1/lease"), http.StatusUnauthorized, protocol.Unauthenticated},
		{"error-bad-json", acquire(tok, "conformance-bad-json-"+r.nonce, `{"label":`), http.StatusBadRequest, protocol.InvalidRequest},
		{"error-unknown-field", acquire(tok, "conformance-unknown-field-"+r.nonce, valid[:len(valid)-1]+`,"labl":"x"}`), http.StatusBadRequest, protocol.InvalidRequest},
		{"error-idempotency-key-missing", acquire(tok, "", valid), http.StatusBadRequest, protocol.InvalidRequest},
		{"error-egress-required", acquire(tok, "conformance-no-egress-"+r.nonce, `{"label":"sandgate-conformance"}`), http.StatusUnprocessableEntity, protocol.EgressRequired},
		{"error-unknown-workspace", get(tok, "/v1/workspaces/"+sandgate.NewID(sandgate.PrefixWorkspace)), http.StatusNotFound, protocol.NotFound},
		{"error-unknown-snapshot", func(ctx context.Context) (int, protocol.Code, error) {
			return r.raw(ctx, http.MethodDelete, "/v1/snapshots/"+sandgate.NewID(sandgate.PrefixSnapshot), tok, nil, "")
		}, http.StatusNotFound, protocol.NotFound},
	} {
		r.check(ctx, c.name, func(ctx context.Context) error {
			status, code, err := c.call(ctx)
			if err != nil {
				return err
			}
			if status != c.status || code != c.code {
				return fmt.Errorf("answered %d %s, want %d %s", status, orEmpty(code), c.status, c.code)
			}
			return nil
		})
	}
}

// raw sends one request as the client would not (a bad body, no token),
// and returns the answer's status and error code.
func (r *run) raw(ctx context.Context, method, path, tok string, h http.Header, body string) (int, protocol.Code, error) {
	ctx, cancel := context.WithTimeout(ctx, client.DefaultTimeout)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.base+path, rd)
	if err != nil {
		return 0, "", err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, "", err
	}
	var env protocol.Envelope
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(b, &env); err != nil || env.Error.Code == "" {
			return resp.StatusCode, "", fmt.Errorf("answered %d without the error envelope: %.200q", resp.StatusCode, bytes.TrimSpace(b))
		}
	}
	return resp.StatusCode, env.Error.Code, nil
}

// wantCode checks that err is the broker's refusal with status and code.
func wantCode(err error, status int, code protocol.Code) error {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return fmt.Errorf("%v, want %d %s", orNil(err), status, code)
	}
	if ce.Status != status || ce.Code != code {
		return fmt.Errorf("answered %d %s, want %d %s", ce.Status, orEmpty(ce.Code), status, code)
	}
	return nil
}

func hostOf(d string) string {
	if h, _, err := net.SplitHostPort(d); err == nil {
		return h
	}
	return d
}

func decode(b64 string) string {
	b, _ := base64.StdEncoding.DecodeString(b64)
	return string(b)
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func orNil(err error) any {
	if err == nil {
		return "no error"
	}
	return describe(err)
}

func orEmpty(c protocol.Code) string {
	if c == "" {
		return "(no code)"
	}
	return string(c)
}

func nonce() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
