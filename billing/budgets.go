package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/store"
)

// Budget is a monthly spending cap (calendar month, UTC) on an account,
// one of its instances, or an agent slug (account-wide, or within an
// instance). It counts settled usage plus open holds. A hard budget
// refuses admission with budget_exhausted; a soft one only alerts. Alerts
// fire once a month per budget at 50, 80 and 100 %.
type Budget struct {
	InstanceID    string `json:"instance_id,omitempty"`
	Agent         string `json:"agent,omitempty"`
	MonthlyMicros int64  `json:"monthly_micros"` // 0 removes the budget
	Soft          bool   `json:"soft"`
	// UsedMicros is this month's settled usage plus open holds (read only).
	UsedMicros int64 `json:"used_micros"`
}

func (b Budget) scope() string {
	switch {
	case b.InstanceID != "" && b.Agent != "":
		return "i:" + b.InstanceID + ":g:" + b.Agent
	case b.InstanceID != "":
		return "i:" + b.InstanceID
	case b.Agent != "":
		return "g:" + b.Agent
	}
	return "a"
}

// parents are the scopes a budget nests in, widest first.
func (b Budget) parents() []string {
	switch {
	case b.InstanceID != "" && b.Agent != "":
		return []string{"a", "i:" + b.InstanceID, "g:" + b.Agent}
	case b.InstanceID != "" || b.Agent != "":
		return []string{"a"}
	}
	return nil
}

// ErrBudgetAboveParent is returned for a budget above one it nests in.
var ErrBudgetAboveParent = errors.New("billing: a budget may not exceed the account's (or instance's) budget it nests in")

// ErrAgentBudgetHard is returned for an agent budget that is not soft.
var ErrAgentBudgetHard = errors.New("billing: an agent budget can only alert (soft): agent is attribution the client chooses and may omit, never a control (protocol §Conventions); cap the instance or the account")

// SetBudget sets, or with MonthlyMicros 0 removes, a budget. A budget may
// not be above a budget it nests in (instance ≤ account, agent ≤ instance
// and account). An agent budget is soft (ErrAgentBudgetHard): it alerts
// and never refuses, since a client that omits agent escapes it.
func (b *Billing) SetBudget(ctx context.Context, acct string, bg Budget) error {
	key := budgetsKey(acct)
	sc := bg.scope()
	if bg.MonthlyMicros < 0 {
		return fmt.Errorf("budget: monthly amount must be at least 0")
	}
	if bg.MonthlyMicros == 0 {
		return b.rdb.HDel(ctx, key, sc, sc+":soft").Err()
	}
	if bg.Agent != "" && !bg.Soft {
		return ErrAgentBudgetHard
	}
	for _, p := range bg.parents() {
		lim, err := b.rdb.HGet(ctx, key, p).Int64()
		if err == nil && bg.MonthlyMicros > lim {
			return fmt.Errorf("%w (%s is %s)", ErrBudgetAboveParent, p, FormatAmount(lim))
		}
	}
	return b.rdb.HSet(ctx, key, sc, bg.MonthlyMicros, sc+":soft", boolField(bg.Soft)).Err()
}

// Budgets lists an account's budgets with this month's use.
func (b *Billing) Budgets(ctx context.Context, acct string, now time.Time) ([]Budget, error) {
	m, err := b.rdb.HGetAll(ctx, budgetsKey(acct)).Result()
	if err != nil {
		return nil, err
	}
	spend, err := b.rdb.HGetAll(ctx, spendKey(acct, month(now))).Result()
	if err != nil {
		return nil, err
	}
	var out []Budget
	for sc, v := range m {
		if strings.HasSuffix(sc, ":soft") {
			continue
		}
		lim, _ := strconv.ParseInt(v, 10, 64)
		// An agent's budget only alerts, even one stored hard before.
		bg := Budget{MonthlyMicros: lim, Soft: m[sc+":soft"] == "1" || strings.Contains(sc, "g:")}
		rest := sc
		if inst, ok := strings.CutPrefix(rest, "i:"); ok {
			bg.InstanceID, rest, _ = strings.Cut(inst, ":")
			rest = ":" + rest
		}
		if g, ok := strings.CutPrefix(strings.TrimPrefix(rest, ":"), "g:"); ok {
			bg.Agent = g
		}
		h, _ := strconv.ParseInt(spend[sc+":h"], 10, 64)
		s, _ := strconv.ParseInt(spend[sc+":s"], 10, 64)
		bg.UsedMicros = h + s
		out = append(out, bg)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].scope() < out[j].scope() })
	return out, nil
}

// Alert is a budget reaching a threshold in a month.
type Alert struct {
	Scope       string `json:"scope"`
	Level       string `json:"level"` // account, instance or agent
	Threshold   int    `json:"threshold"`
	Month       string `json:"month"` // YYYYMM, UTC
	UsedMicros  int64  `json:"used_micros,string"`
	LimitMicros int64  `json:"limit_micros,string"`
	Soft        bool   `json:"soft"`
	AtMS        int64  `json:"at_ms,string"`
}

// AuditRetention is how long budget alerts stay in the audit log.
const AuditRetention = 400 * 24 * time.Hour

// maxFlush bounds the alerts one FlushAlerts writes; the rest wait for
// the next.
const maxFlush = 1000

// FlushAlerts writes the account's queued budget alerts to the operator
// audit log (action budget.alert, actor "sandgate", target the account,
// after the alert) and queues its webhook, if one is configured
// ([Billing.RunWebhooks] delivers it). Settlement calls it; the gateway
// calls it after an admission. An alert leaves its queue only once both
// are written, and each is written once by the alert's event id, so a
// flush that fails or dies midway, or two at once, neither drops an alert
// nor writes it twice; one that failed stays queued for the next flush.
func (b *Billing) FlushAlerts(ctx context.Context, acct string) {
	queued, err := b.rdb.LRange(ctx, alertsKey(acct), 0, maxFlush-1).Result()
	if err != nil {
		b.log.Error("budget alerts: read", slog.String("account", acct), slog.Any("err", err))
		return
	}
	cur := b.webhookCurrency(ctx, acct, len(queued))
	done := 0
	for _, raw := range queued {
		var a Alert
		if err := json.Unmarshal([]byte(raw), &a); err != nil {
			// It can never be written; keeping it would hold back the rest.
			b.log.Error("budget alerts: dropped one that does not decode", slog.String("account", acct), slog.Any("err", err))
		} else if err := b.writeAlert(ctx, acct, cur, a); err != nil {
			b.log.Error("budget alerts: write", slog.String("account", acct), slog.Any("err", err))
			break
		}
		done++
	}
	if done == 0 {
		return
	}
	args := make([]any, done)
	for i, raw := range queued[:done] {
		args[i] = raw
	}
	if err := dequeueAlertsScript.Run(ctx, b.rdb, []string{alertsKey(acct)}, args...).Err(); err != nil {
		b.log.Error("budget alerts: dequeue", slog.String("account", acct), slog.Any("err", err))
	}
}

// writeAlert writes one queued alert's audit entry and queues its
// webhook (in currency cur), each once by the alert's event id.
func (b *Billing) writeAlert(ctx context.Context, acct, cur string, a Alert) error {
	body, _ := json.Marshal(a)
	e := store.AuditEvent{Time: time.UnixMilli(a.AtMS).UTC(), Actor: "sandgate", Action: "budget.alert", Target: "account:" + acct,
		Outcome: store.AuditOutcome{Status: 200}, Before: json.RawMessage("null"), After: body}
	if err := b.db.AppendAuditOnce(ctx, e, alertEventID(acct, a), AuditRetention); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if err := b.enqueueWebhook(ctx, acct, cur, a); err != nil {
		return fmt.Errorf("queue webhook: %w", err)
	}
	return nil
}

// dequeueAlertsScript takes written alerts off the head of the queue: it
// pops while the head is the next of ARGV, so a flush that ran beside
// another (or is sent again) takes off only what is still there.
//
// KEYS[1] alerts LIST
// ARGV the alerts written, oldest first
// Returns how many were taken off.
var dequeueAlertsScript = redis.NewScript(`
local n = 0
for i = 1, #ARGV do
  if redis.call('LINDEX', KEYS[1], 0) ~= ARGV[i] then break end
  redis.call('LPOP', KEYS[1])
  n = n + 1
end
return n
`)
