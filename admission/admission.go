// Package admission decides whether an Acquire may run: an ordered
// pipeline of checks (stop and pause state, instance concurrency, then
// funds, budgets and risk) whose Redis part is composed into one Lua script,
// so a refused request changes nothing and an admitted one holds its slot
// and reservations in the same step. It also limits request rates.
package admission

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
)

// Request is one Acquire to admit.
type Request struct {
	// Workspace is the record to write, state starting, every field set.
	Workspace sandgate.Workspace
	// Scope is the instance's effective scope.
	Scope sandgate.Scope
	// Keys are the account-scoped Redis keys the script may touch.
	Keys store.Keys
	// KeyHash and RequestHash identify the Idempotency-Key and the request.
	KeyHash, RequestHash string
	Now                  time.Time

	// Queued is set by Admit when an admitted request's checks queued
	// follow-up work outside the script (billing's budget check queued a
	// budget alert): the caller flushes it. Otherwise nothing was queued
	// and the caller need not look.
	Queued bool
}

// Check is one admission rule. Its Lua is spliced, straight-line, into
// the one admission script; Bind supplies its keys and arguments for a
// request.
type Check interface {
	// Name identifies the check in metrics and in the script's comments.
	Name() string
	// Arity is how many keys and arguments Bind returns, always the same
	// for a check, so that the script knows every check's offsets when it
	// is built. Only the last check of a pipeline may have args -1: as
	// many as Bind returns.
	Arity() (keys, args int)
	// Lua returns the check's fragments, spliced into the script as they
	// are (no function is built per call). In each, the check's keys are
	// KEYS[kb + 1] on and its arguments ARGV[ab + 1] to ARGV[ab + na];
	// NOW (unix ms) and WS (the workspace id) are strings every check
	// may read.
	// Check runs before anything is written and falls through to pass,
	// or refuses with return {0, I, code, reason[, retry_after_ms]}
	// (reason a string, never nil). Apply runs only once every check has
	// passed and never returns; it sets Q = 1 when it queued follow-up
	// work (see Request.Queued). Both may read and set S, a local of the
	// check's own (nil at first), to hand the apply what the check read.
	Lua() (check, apply string)
	// Bind returns the keys (all of the request's account) and arguments
	// of the check for r.
	Bind(r *Request) (keys []string, args []any)
}

// PreCheck is a Check with a part that runs in Go before the script, for
// state that cannot share the account's Redis slot (the broker-wide stop).
type PreCheck interface {
	Pre(ctx context.Context, r *Request) error
}

// Pipeline runs its checks in order as one script. Create it with New.
type Pipeline struct {
	rdb    redis.UniversalClient
	checks []Check
	pre    []PreCheck
	nk, na int // the keys and arguments of a request, but a variable last check's
	script *redis.Script
}

// common is how many arguments precede the checks': NOW and WS.
const common = 2

// New composes the checks, in order, into one admission script: each
// check's Lua inlined at its offsets, every check first, then every
// apply. New panics when a check other than the last has a variable
// number of arguments.
func New(rdb redis.UniversalClient, checks ...Check) *Pipeline {
	p := &Pipeline{rdb: rdb, checks: checks}
	type at struct{ kb, ab, na int }
	offs := make([]at, len(checks))
	kb, ab := 0, common
	for i, c := range checks {
		if pc, ok := c.(PreCheck); ok {
			p.pre = append(p.pre, pc)
		}
		k, a := c.Arity()
		if a < 0 && i != len(checks)-1 {
			panic(fmt.Sprintf("admission: check %s has a variable number of arguments but is not last", c.Name()))
		}
		offs[i] = at{kb, ab, a}
		kb += k
		if a > 0 {
			ab += a
		}
	}
	p.nk, p.na = kb, ab
	var b strings.Builder
	b.WriteString("local NOW, WS = ARGV[1], ARGV[2]\nlocal Q = 0\n")
	for i := range checks {
		fmt.Fprintf(&b, "local S%d\n", i+1)
	}
	block := func(i int, body string) {
		na := strconv.Itoa(offs[i].na)
		if offs[i].na < 0 {
			na = "#ARGV - " + strconv.Itoa(offs[i].ab)
		}
		fmt.Fprintf(&b, "do -- %d: %s\nlocal I, kb, ab, na = %d, %d, %d, %s\n", i+1, checks[i].Name(), i+1, offs[i].kb, offs[i].ab, na)
		b.WriteString(body)
	}
	for i, c := range checks {
		check, _ := c.Lua()
		block(i, fmt.Sprintf("local S\n%s\nS%d = S\nend\n", check, i+1))
	}
	for i, c := range checks {
		_, apply := c.Lua()
		block(i, fmt.Sprintf("local S = S%d\n%s\nend\n", i+1, apply))
	}
	b.WriteString("return {1, Q}\n")
	p.script = redis.NewScript(b.String())
	return p
}

// Replay is returned by Admit when the Idempotency-Key was already claimed.
type Replay struct{ Record store.IdemRecord }

func (r *Replay) Error() string { return "admission: idempotency key already claimed" }

// codeReplay is the refusal code the idempotency check uses for a replay.
const codeReplay = "replay"

// Admit runs every check. It returns nil when admitted; a *Replay when the
// key was claimed before; a *protocol.Error refusal; or
// AdmissionUnavailable when the state cannot be read (fail closed).
func (p *Pipeline) Admit(ctx context.Context, r *Request) error {
	for _, pc := range p.pre {
		if err := pc.Pre(ctx, r); err != nil {
			return err
		}
	}
	keys := make([]string, 0, p.nk)
	args := make([]any, common, p.na+32)
	args[0], args[1] = r.Now.UnixMilli(), r.Workspace.ID
	for _, c := range p.checks {
		k, a := c.Bind(r)
		keys = append(keys, k...)
		args = append(args, a...)
	}
	res, err := p.script.Run(ctx, p.rdb, keys, args...).Slice()
	if err != nil {
		return unavailable(err)
	}
	if ok, _ := res[0].(int64); ok == 1 {
		if len(res) == 2 {
			q, _ := res[1].(int64)
			r.Queued = q == 1
		}
		return nil
	}
	if len(res) < 4 {
		return unavailable(fmt.Errorf("admission: unexpected script result %v", res))
	}
	idx, _ := res[1].(int64)
	code, _ := res[2].(string)
	reason, _ := res[3].(string)
	var retryMS int64
	if len(res) > 4 {
		retryMS, _ = res[4].(int64)
	}
	if code == codeReplay {
		var rec store.IdemRecord
		if err := store.DecodeIdemRecord(reason, &rec); err != nil {
			return unavailable(err)
		}
		if rec.WorkspaceID == r.Workspace.ID && rec.State == store.IdemInProgress {
			// This request's own claim (its workspace id is new): the
			// script ran before and its answer was lost, and go-redis sent
			// it again. Everything it admits is written; whether it
			// queued a budget alert is not known, so the caller looks.
			r.Queued = true
			return nil
		}
		return &Replay{Record: rec}
	}
	name := "?"
	if idx >= 1 && int(idx) <= len(p.checks) {
		name = p.checks[idx-1].Name()
	}
	return refusal(protocol.Code(code), reason, time.Duration(retryMS)*time.Millisecond, name)
}

// messages are the operator-actionable texts of each refusal.
var messages = map[protocol.Code]string{
	protocol.EmergencyStopped:  "the broker's operator stopped execution",
	protocol.Paused:            "admission is paused for this account or instance",
	protocol.ConcurrencyLimit:  "the instance is at max_concurrent_workspaces; release a workspace or wait",
	protocol.RiskLimit:         "the broker is temporarily limiting this account",
	protocol.InsufficientFunds: "the account cannot cover the workspace; add funds to resume execution",
	protocol.BudgetExhausted:   "a usage budget is reached",
}

func refusal(code protocol.Code, reason string, retry time.Duration, check string) error {
	msg, ok := messages[code]
	if !ok {
		return unavailable(fmt.Errorf("admission: check %s refused with unknown code %q", check, code))
	}
	return &protocol.Error{Code: code, Message: msg, Reason: reason, RetryAfter: retry}
}

func unavailable(err error) error {
	return &protocol.Error{Code: protocol.AdmissionUnavailable,
		Message: "the broker cannot evaluate admission; retry shortly", RetryAfter: time.Second, Err: err}
}

// IsReplay reports whether err is a *Replay and returns its record.
func IsReplay(err error) (store.IdemRecord, bool) {
	var r *Replay
	if errors.As(err, &r) {
		return r.Record, true
	}
	return store.IdemRecord{}, false
}
