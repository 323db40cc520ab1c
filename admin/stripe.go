package admin

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/stripesync"
)

// StripeSync is the Stripe Billing sync as the operator API uses it
// (*stripesync.Syncer): an account's settings, status and dead letters.
type StripeSync interface {
	// Account returns acct's settings; stripesync.ErrNotConfigured when none.
	Account(ctx context.Context, acct string) (stripesync.Account, error)
	// SetAccount turns the sync on for acct, or changes its settings.
	SetAccount(ctx context.Context, acct string, a stripesync.Account) error
	// ClearAccount turns the sync off for acct.
	ClearAccount(ctx context.Context, acct string) error
	// Status reports acct's sync.
	Status(ctx context.Context, acct string) (stripesync.Status, error)
	// Retry requeues acct's dead letters entryIDs (none: all) and says how many.
	Retry(ctx context.Context, acct string, entryIDs ...string) (int, error)
}

// errStripeOff is every Stripe answer of a broker without the sync.
var errStripeOff = "Stripe sync is not configured on this broker: set its Stripe secret key (" +
	stripesync.DefaultSecretKeyEnv + " unless billing.stripe.secret_key_env names another variable) and restart it"

// stripeRoutes adds the Stripe sync's routes: reading is finance's as
// well as admin's (as reconcile), requeueing is admin's.
func (s *Server) stripeRoutes(route func(method, path, action string, h echo.HandlerFunc, roles []adminapi.Role)) {
	route(http.MethodGet, "/accounts/:id/billing/stripe", "billing.stripe_status", s.stripeStatus, []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleFinance})
	route(http.MethodPost, "/accounts/:id/billing/stripe/retry", "billing.stripe_retry", s.stripeRetry, []adminapi.Role{adminapi.RoleAdmin})
}

func (s *Server) stripeStatus(c echo.Context) error {
	acct, err := s.accountParam(c)
	if err != nil {
		return err
	}
	out, err := s.stripeAccountStatus(c.Request().Context(), acct)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// stripeAccountStatus is acct's Stripe sync status. Returns NotFound for
// an unknown account or a broker without the sync.
func (v *service) stripeAccountStatus(ctx context.Context, acct string) (adminapi.StripeStatus, error) {
	if v.stripe == nil {
		return adminapi.StripeStatus{}, protocol.E(protocol.NotFound, errStripeOff)
	}
	if err := v.account(ctx, acct); err != nil {
		return adminapi.StripeStatus{}, err
	}
	st, err := v.stripe.Status(ctx, acct)
	if err != nil {
		return adminapi.StripeStatus{}, storeFailed(err)
	}
	return toStripeStatus(acct, st), nil
}

func (s *Server) stripeRetry(c echo.Context) error {
	var req adminapi.StripeRetryRequest
	acct, err := s.accountParam(c)
	if err != nil {
		return err
	}
	if err := decodeOptional(c, &req); err != nil {
		return err
	}
	out, ch, err := s.stripeRequeue(c.Request().Context(), acct, req.EntryIDs)
	return answer(c, http.StatusOK, out, ch, err)
}

// stripeRequeue requeues acct's dead letters ids (none: all). Returns
// NotFound for an unknown account or a broker without the sync.
func (v *service) stripeRequeue(ctx context.Context, acct string, ids []string) (adminapi.StripeRetryResult, change, error) {
	ch := change{target: "account:" + acct}
	if v.stripe == nil {
		return adminapi.StripeRetryResult{}, ch, protocol.E(protocol.NotFound, errStripeOff)
	}
	if len(ids) > 10000 {
		return adminapi.StripeRetryResult{}, ch, invalid("entry_ids: at most 10000 at a time; none means every dead letter")
	}
	if err := v.account(ctx, acct); err != nil {
		return adminapi.StripeRetryResult{}, ch, err
	}
	n, err := v.stripe.Retry(ctx, acct, ids...)
	if err != nil {
		return adminapi.StripeRetryResult{}, ch, storeFailed(err)
	}
	out := adminapi.StripeRetryResult{Requeued: n}
	ch.after = map[string]any{"entry_ids": ids, "requeued": n}
	return out, ch, nil
}

func toStripeStatus(acct string, st stripesync.Status) adminapi.StripeStatus {
	t := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return protocol.Time(t)
	}
	out := adminapi.StripeStatus{AccountID: acct, Enabled: st.Enabled, Customer: st.Account.Customer, EventName: st.Account.EventName,
		Unit: string(st.Account.Unit), Since: t(st.Account.Since), Cursor: st.Cursor, Pending: st.Pending, PendingMore: st.PendingMore,
		OldestPending: t(st.OldestPending), LagSeconds: st.Lag.Seconds(), Sent: st.Sent, Failures: st.Failures, DeadLettered: st.DeadLettered,
		LastError: st.LastError, LastErrorAt: t(st.LastErrorAt), LastSentAt: t(st.LastSentAt)}
	letters := func(ds []stripesync.DeadLetter) []adminapi.StripeDeadLetter {
		out := make([]adminapi.StripeDeadLetter, 0, len(ds))
		for _, d := range ds {
			out = append(out, adminapi.StripeDeadLetter{EntryID: d.EntryID, StreamID: d.StreamID, Identifier: d.Identifier,
				Status: d.Status, Error: d.Error, Attempts: d.Attempts, At: t(d.At)})
		}
		return out
	}
	out.DeadLetters, out.Requeued = letters(st.DeadLetters), letters(st.Requeued)
	return out
}

// stripeSettings is the Stripe part of a billing settings PUT: the
// fields the operator sent, over the account's current ones.
type stripeSettings struct {
	customer, eventName, unit *string
}

func stripeRequest(req adminapi.BillingSettings) stripeSettings {
	return stripeSettings{customer: req.StripeCustomer, eventName: req.StripeMeterEvent, unit: req.StripeUnit}
}

// stripeOp is what a billing settings PUT does to the account's Stripe
// sync: set it to set (validated), or clear it.
type stripeOp struct {
	set   stripesync.Account
	clear bool
}

// stripePlan is what a PUT does to acct's Stripe sync; nil when it sent
// no Stripe field. Returns InvalidRequest with stripesync's message, or
// when the broker has no sync and a Stripe field was sent.
func (v *service) stripePlan(ctx context.Context, acct string, in stripeSettings) (*stripeOp, error) {
	if in.customer == nil && in.eventName == nil && in.unit == nil {
		return nil, nil
	}
	if v.stripe == nil {
		return nil, invalid(errStripeOff)
	}
	cur, err := v.stripe.Account(ctx, acct)
	if err != nil && !errors.Is(err, stripesync.ErrNotConfigured) {
		return nil, storeFailed(err)
	}
	a := stripesync.Account{Customer: cur.Customer, EventName: cur.EventName, Unit: cur.Unit}
	if in.customer != nil {
		a.Customer = *in.customer
	}
	if in.eventName != nil {
		a.EventName = *in.eventName
	}
	if in.unit != nil {
		a.Unit = stripesync.Unit(*in.unit)
	}
	if a.Customer == "" && a.EventName == "" {
		return &stripeOp{clear: true}, nil
	}
	if err := a.Validate(); err != nil {
		return nil, invalid(err.Error())
	}
	return &stripeOp{set: a}, nil
}

// applyStripe carries out a plan of stripePlan (nil: nothing).
func (v *service) applyStripe(ctx context.Context, acct string, op *stripeOp) error {
	switch {
	case op == nil:
		return nil
	case op.clear:
		return storeErr(v.stripe.ClearAccount(ctx, acct))
	}
	return storeErr(v.stripe.SetAccount(ctx, acct, op.set))
}

// withStripe adds acct's Stripe settings to bs, when the sync is on.
func (v *service) withStripe(ctx context.Context, acct string, bs *adminapi.BillingSettings) error {
	if v.stripe == nil {
		return nil
	}
	a, err := v.stripe.Account(ctx, acct)
	if errors.Is(err, stripesync.ErrNotConfigured) {
		return nil
	}
	if err != nil {
		return err
	}
	unit := string(a.Unit)
	bs.StripeCustomer, bs.StripeMeterEvent, bs.StripeUnit = &a.Customer, &a.EventName, &unit
	return nil
}

// Interface guards
var _ StripeSync = (*stripesync.Syncer)(nil)
