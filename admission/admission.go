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

// Check is one admission rule. Its Lua runs inside the one admission
// script; Bind supplies its keys and arguments for a request.
type Check interface {
	// Name identifies the check in metrics and in the script's comments.
	Name() string
	// Lua returns the check's fragments. Each is the body of a Lua function
	// of (kb, ab, na): its bound keys are KEYS[kb + 1] on, its na bound
	// arguments ARGV[ab + 1] to ARGV[ab + na] (offsets, so that no call
	// copies them). Check runs before anything is written and returns nil
	// to pass, or {code, reason, retry_after_ms} to refuse; Apply runs only
	// once every check has passed, and returns true when it queued
	// follow-up work (see Request.Queued). Both may read and set S, a local
	// of the check's own (nil at first), to hand the apply what the check
	// read.
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
	script *redis.Script
}

// New composes the checks, in order, into one admission script.
func New(rdb redis.UniversalClient, checks ...Check) *Pipeline {
	var b strings.Builder
	b.WriteString(scriptHeader)
	for i, c := range checks {
		check, apply := c.Lua()
		fmt.Fprintf(&b, "-- %d: %s\ndo\nlocal S\nchecks[%d] = function(kb, ab, na)\n%s\nend\napplies[%d] = function(kb, ab, na)\n%s\nend\nend\n",
			i+1, c.Name(), i+1, check, i+1, apply)
	}
	b.WriteString(scriptFooter)
	return &Pipeline{rdb: rdb, checks: checks, script: redis.NewScript(b.String())}
}

// scriptHeader and scriptFooter frame the checks. ARGV[1] is the number
// of checks; then, for each check, its key count and argument count; then
// every check's arguments in order. KEYS are every check's keys in order.
// The footer turns the counts into each check's offsets once; no key or
// argument is copied.
const scriptHeader = `local checks, applies = {}, {}
`

const scriptFooter = `local n = tonumber(ARGV[1])
local kb, ab, na = {}, {}, {}
local ki, ai = 0, 1 + 2 * n
for i = 1, n do
  local a = tonumber(ARGV[2 * i + 1])
  kb[i], ab[i], na[i] = ki, ai, a
  ki, ai = ki + tonumber(ARGV[2 * i]), ai + a
end
for i = 1, n do
  local r = checks[i](kb[i], ab[i], na[i])
  if r then return {0, i, r[1], r[2] or '', tostring(r[3] or 0)} end
end
local queued = 0
for i = 1, n do
  if applies[i](kb[i], ab[i], na[i]) then queued = 1 end
end
return {1, queued}
`

// Replay is returned by Admit when the Idempotency-Key was already claimed.
type Replay struct{ Record store.IdemRecord }

func (r *Replay) Error() string { return "admission: idempotency key already claimed" }

// codeReplay is the refusal code the idempotency check uses for a replay.
const codeReplay = "replay"

// Admit runs every check. It returns nil when admitted; a *Replay when the
// key was claimed before; a *protocol.Error refusal; or
// AdmissionUnavailable when the state cannot be read (fail closed).
func (p *Pipeline) Admit(ctx context.Context, r *Request) error {
	for _, c := range p.checks {
		if pc, ok := c.(PreCheck); ok {
			if err := pc.Pre(ctx, r); err != nil {
				return err
			}
		}
	}
	// Each check's keys and arguments, then the script's two slices at
	// their exact sizes.
	type bound struct {
		keys []string
		args []any
	}
	bs := make([]bound, len(p.checks))
	nk, na := 0, 1+2*len(p.checks)
	for i, c := range p.checks {
		bs[i].keys, bs[i].args = c.Bind(r)
		nk += len(bs[i].keys)
		na += len(bs[i].args)
	}
	keys := make([]string, 0, nk)
	args := make([]any, 1+2*len(p.checks), na)
	args[0] = len(p.checks)
	for i, b := range bs {
		keys = append(keys, b.keys...)
		args[1+2*i], args[2+2*i] = len(b.keys), len(b.args)
		args = append(args, b.args...)
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
	if len(res) != 5 {
		return unavailable(fmt.Errorf("admission: unexpected script result %v", res))
	}
	idx, _ := res[1].(int64)
	code, _ := res[2].(string)
	reason, _ := res[3].(string)
	retryMS, _ := strconv.ParseInt(fmt.Sprint(res[4]), 10, 64)
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
