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

// SetBudget sets, or with MonthlyMicros 0 removes, a budget. A budget may
// not be above a budget it nests in (instance ≤ account, agent ≤ instance
// and account).
func (b *Billing) SetBudget(ctx context.Context, acct string, bg Budget) error {
	key := budgetsKey(acct)
	sc := bg.scope()
	if bg.MonthlyMicros < 0 {
		return fmt.Errorf("budget: monthly amount must be at least 0")
	}
	if bg.MonthlyMicros == 0 {
		return b.rdb.HDel(ctx, key, sc, sc+":soft").Err()
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
		bg := Budget{MonthlyMicros: lim, Soft: m[sc+":soft"] == "1"}
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

// DrainAlerts takes the account's queued budget alerts, oldest first; the
// caller writes them to the audit log.
func (b *Billing) DrainAlerts(ctx context.Context, acct string) ([]Alert, error) {
	var out []Alert
	for range 1000 {
		raw, err := b.rdb.LPop(ctx, alertsKey(acct)).Result()
		if err != nil {
			if isNil(err) {
				break
			}
			return out, err
		}
		var a Alert
		if err := json.Unmarshal([]byte(raw), &a); err != nil {
			return out, err
		}
		out = append(out, a)
	}
	return out, nil
}

// AuditRetention is how long budget alerts stay in the audit log.
const AuditRetention = 400 * 24 * time.Hour

// FlushAlerts writes the account's queued budget alerts to the operator
// audit log (action budget.alert, actor "sandgate", target the account,
// after the alert) and queues its webhook, if one is configured
// ([Billing.RunWebhooks] delivers it). Settlement calls it; the gateway
// calls it after an admission. An alert whose write fails is logged and dropped, never
// retried into a duplicate.
func (b *Billing) FlushAlerts(ctx context.Context, acct string) {
	alerts, err := b.DrainAlerts(ctx, acct)
	if err != nil {
		b.cfg.Log.Error("budget alerts: read", slog.String("account", acct), slog.Any("err", err))
	}
	for _, a := range alerts {
		body, _ := json.Marshal(a)
		at := time.UnixMilli(a.AtMS).UTC()
		e := store.AuditEvent{Time: at, Actor: "sandgate", Action: "budget.alert", Target: "account:" + acct,
			Outcome: store.AuditOutcome{Status: 200}, Before: json.RawMessage("null"), After: body}
		if err := b.db.AppendAudit(ctx, e, AuditRetention); err != nil {
			b.cfg.Log.Error("budget alerts: write audit", slog.String("account", acct), slog.Any("err", err))
		}
		if err := b.enqueueWebhook(ctx, acct, a); err != nil {
			b.cfg.Log.Error("budget alerts: queue webhook", slog.String("account", acct), slog.Any("err", err))
		}
	}
}
