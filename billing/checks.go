package billing

import (
	"context"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/protocol"
)

// Checks returns the admission checks of billing, in order: funds, then
// budgets. They slot in between Concurrency and Risk (admission.Standard).
func (b *Billing) Checks() []admission.Check {
	return []admission.Check{FundsCheck{b: b}, BudgetCheck{}}
}

// FundsCheck refuses an account whose billing was never configured
// (neither set nor marked free), prices the workspace (Pre) and, for a
// prepaid account, refuses insufficient_funds unless its available amount
// plus credit limit covers the worst case; admitted, it holds the worst
// case in the same script that takes the concurrency slot.
type FundsCheck struct{ b *Billing }

// Name implements admission.Check.
func (FundsCheck) Name() string { return "funds" }

// Pre implements admission.PreCheck: it reads the account's rate card
// (global, outside the account's slot) and writes the price on the
// workspace record the pipeline is about to write.
func (c FundsCheck) Pre(ctx context.Context, r *admission.Request) error {
	w := &r.Workspace
	pr, err := c.b.pricing(ctx, w.AccountID)
	if err != nil {
		return &protocol.Error{Code: protocol.AdmissionUnavailable,
			Message: "the broker cannot price the workspace; retry shortly", RetryAfter: time.Second, Err: err}
	}
	if !pr.settings.Configured {
		return NotConfigured(w.AccountID)
	}
	p, err := pr.price(w.Size, w.CreatedAt, w.ExpiresAt)
	if err != nil {
		return &protocol.Error{Code: protocol.AdmissionUnavailable,
			Message: "the broker cannot price the workspace; retry shortly", RetryAfter: time.Second, Err: err}
	}
	w.Price = p
	return nil
}

// ReasonNotConfigured is details.reason of the insufficient_funds refusal
// of an account whose billing was never configured.
const ReasonNotConfigured = "billing_not_configured"

// NotConfigured is the refusal of an acquire for an account whose billing
// an operator never configured. The spec's funds refusal (402
// insufficient_funds, not retryable): the account has nothing that covers
// a workspace, and only an operator can change that; a 4xx before any
// side effect leaves the idempotency key unused, so the client's retry
// works once billing is set.
func NotConfigured(acct string) error {
	return &protocol.Error{Code: protocol.InsufficientFunds, Reason: ReasonNotConfigured,
		Message: "account " + acct + " has no billing settings: an operator must set them (sandgate admin billing set) " +
			"or mark the account free (sandgate admin billing set --free)"}
}

// Arity implements admission.Check.
func (FundsCheck) Arity() (int, int) { return 3, 1 }

// Lua implements admission.Check. KEYS[kb + 1] settings HASH, KEYS[kb + 2] funds HASH,
// KEYS[kb + 3] holds HASH; ARGV[ab + 1] hold (micros). The check leaves
// the hold, as a number, in S for the apply.
func (FundsCheck) Lua() (string, string) {
	return `local st = redis.call('HMGET', KEYS[kb + 1], 'configured', 'postpaid', 'credit_limit')
if st[1] ~= '1' then return {0, I, '` + string(protocol.InsufficientFunds) + `', '` + ReasonNotConfigured + `'} end
S = tonumber(ARGV[ab + 1])
if st[2] ~= '1' then
  local f = redis.call('HMGET', KEYS[kb + 2], 'balance', 'holds')
  local avail = (tonumber(f[1]) or 0) - (tonumber(f[2]) or 0) + (tonumber(st[3]) or 0)
  if avail < S then return {0, I, '` + string(protocol.InsufficientFunds) + `', ''} end
end`, `if S > 0 then
  redis.call('HINCRBY', KEYS[kb + 2], 'holds', ARGV[ab + 1])
  redis.call('HSET', KEYS[kb + 3], WS, ARGV[ab + 1])
end`
}

// Bind implements admission.Check.
func (FundsCheck) Bind(r *admission.Request) ([]string, []any) {
	a := r.Workspace.AccountID
	return []string{settingsKey(a), fundsKey(a), holdsKey(a)}, []any{r.Workspace.Price.HoldMicros}
}

// BudgetCheck refuses budget_exhausted when a hard monthly budget of the
// workspace's account or instance would go over its cap (an agent's only
// alerts: agent is attribution, never a control): settled
// usage plus open holds of the calendar month (UTC) plus this worst case.
// Admitted, it counts the hold against every scope of the workspace and
// queues threshold alerts.
type BudgetCheck struct{}

// Name implements admission.Check.
func (BudgetCheck) Name() string { return "budget" }

// Arity implements admission.Check: the hold, the month and up to four
// scopes ("" past the workspace's own).
func (BudgetCheck) Arity() (int, int) { return 4, 2 + maxScopes }

// maxScopes is how many budget scopes a workspace counts against at most
// (scopes).
const maxScopes = 4

// Lua implements admission.Check. KEYS[kb + 1] budgets HASH, KEYS[kb + 2] spend HASH (the
// month's), KEYS[kb + 3] alerted SET (the month's), KEYS[kb + 4] alerts LIST; ARGV[ab + 1] hold,
// ARGV[ab + 2] month, ARGV[ab + 3 .. ab + na] scopes, "" for none.
//
// An account without budgets (no budgets HASH) costs one EXISTS, which
// the check leaves in S for the apply (it runs after every check,
// in the same script), and an admission that holds nothing there writes
// nothing. The budget functions are defined only where budgets or a
// hold need them.
func (BudgetCheck) Lua() (string, string) {
	return `S = redis.call('EXISTS', KEYS[kb + 1]) == 1
if S then
` + budgetLua + `
  local w = tonumber(ARGV[ab + 1])
  for i = ab + 3, ab + na do
    local s = ARGV[i]
    if s ~= '' and scope_level(s) ~= 'agent' then
      local lim = tonumber(redis.call('HGET', KEYS[kb + 1], s))
      if lim and redis.call('HGET', KEYS[kb + 1], s .. ':soft') ~= '1' then
        if spent(KEYS[kb + 2], s) + w > lim then return {0, I, '` + string(protocol.BudgetExhausted) + `', scope_level(s)} end
      end
    end
  end
end`, `local hold = tonumber(ARGV[ab + 1])
if hold > 0 or S then
` + budgetLua + `
  for i = ab + 3, ab + na do
    local s = ARGV[i]
    if s ~= '' then
      if hold > 0 then redis.call('HINCRBY', KEYS[kb + 2], s .. ':h', ARGV[ab + 1]) end
      if S and budget_alerts(KEYS[kb + 1], KEYS[kb + 2], KEYS[kb + 3], KEYS[kb + 4], s, ARGV[ab + 2], NOW) then Q = 1 end
    end
  end
  redis.call('PEXPIRE', KEYS[kb + 2], ` + spendTTL + `)
end`
}

// Bind implements admission.Check.
func (BudgetCheck) Bind(r *admission.Request) ([]string, []any) {
	w := r.Workspace
	m := month(w.CreatedAt)
	args := make([]any, 2, 2+maxScopes)
	args[0], args[1] = w.Price.HoldMicros, m
	for _, s := range scopes(w.InstanceID, w.Agent) {
		args = append(args, s)
	}
	for len(args) < cap(args) {
		args = append(args, "")
	}
	return []string{budgetsKey(w.AccountID), spendKey(w.AccountID, m), alertedKey(w.AccountID, m), alertsKey(w.AccountID)}, args
}

// spendTTL keeps a month's spending counters (ms): 400 days.
const spendTTL = "34560000000"

// budgetLua is shared by the budget check and settlement: spent(spend,
// scope) is the month's settled plus held amount of a scope; scope_level
// names a scope's level for a refusal's reason; budget_alerts queues an
// alert the first time a scope's spending reaches 50, 80 and 100 % of its
// cap in a month, and returns whether it queued one.
const budgetLua = `
local function spent(spend, s)
  return (tonumber(redis.call('HGET', spend, s .. ':h')) or 0) + (tonumber(redis.call('HGET', spend, s .. ':s')) or 0)
end
local function scope_level(s)
  if s == 'a' then return 'account' end
  if string.find(s, 'g:', 1, true) then return 'agent' end
  return 'instance'
end
local function budget_alerts(budgets, spend, alerted, list, s, mon, now)
  local lim = tonumber(redis.call('HGET', budgets, s))
  if not lim or lim <= 0 then return false end
  local queued = false
  local used = spent(spend, s)
  for _, p in ipairs({50, 80, 100}) do
    if used * 100 >= lim * p and redis.call('SADD', alerted, s .. ':' .. p) == 1 then
      redis.call('PEXPIRE', alerted, ` + spendTTL + `)
      redis.call('RPUSH', list, cjson.encode({scope = s, level = scope_level(s), threshold = p, month = mon,
        used_micros = string.format('%d', used), limit_micros = string.format('%d', lim),
        soft = redis.call('HGET', budgets, s .. ':soft') == '1', at_ms = string.format('%d', tonumber(now))}))
      queued = true
    end
  end
  return queued
end
`

// month is the calendar month (UTC) of t, as spending keys name it.
// It is built by hand, not by Format's layout parsing, as every Acquire
// and release names one or more months.
func month(t time.Time) string {
	y, m, _ := t.UTC().Date()
	if y < 1000 || y > 9999 {
		return t.UTC().Format("200601")
	}
	b := make([]byte, 0, 6)
	b = strconv.AppendInt(b, int64(y), 10)
	if m < 10 {
		b = append(b, '0')
	}
	return string(strconv.AppendInt(b, int64(m), 10))
}

// scopes are the budget scopes a workspace counts against, widest first.
func scopes(inst, agent string) []string {
	s := []string{"a", "i:" + inst}
	if agent != "" {
		s = append(s, "g:"+agent, "i:"+inst+":g:"+agent)
	}
	return s
}

// Interface guards.
var (
	_ admission.PreCheck = FundsCheck{}
	_ admission.Check    = BudgetCheck{}
)
