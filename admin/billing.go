package admin

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/protocol"
)

// Rate cards, account billing settings, funds and budgets. Amounts on the
// wire are decimal strings of currency units ("25.00"), parsed by
// billing.ParseAmount (at most 6 fractional digits, never rounded), with
// their exact micro-unit integers beside them in answers.

// billingRoutes adds the billing routes; New calls it with its route helper.
func (s *Server) billingRoutes(route func(method, path, action string, h echo.HandlerFunc, roles []adminapi.Role)) {
	read := []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleOperator, adminapi.RoleFinance}
	adm := []adminapi.Role{adminapi.RoleAdmin}
	route(http.MethodPost, "/rate-cards", "rate_card.create", s.createRateCard, adm)
	route(http.MethodGet, "/rate-cards", "rate_card.list", s.listRateCards, read)
	route(http.MethodPut, "/rate-cards/:name/currency", "rate_card.set_currency", s.setRateCardCurrency, adm)
	route(http.MethodPut, "/accounts/:id/billing", "billing.set", s.setBilling, adm)
	route(http.MethodGet, "/accounts/:id/billing", "billing.get", s.getBilling, read)
	route(http.MethodPost, "/accounts/:id/funds/credit", "funds.credit", s.adjustFunds(billing.KindCredit), adm)
	route(http.MethodPost, "/accounts/:id/funds/debit", "funds.debit", s.adjustFunds(billing.KindDebit), adm)
	route(http.MethodGet, "/accounts/:id/funds", "funds.balance", s.balance, read)
	route(http.MethodPut, "/accounts/:id/budgets", "budget.set", s.setBudget, adm)
	route(http.MethodGet, "/accounts/:id/budgets", "budget.list", s.listBudgets, read)
	route(http.MethodPost, "/accounts/:id/usage/adjustments", "usage.adjust", s.adjustUsage, adm)
	route(http.MethodGet, "/billing/reconcile", "billing.reconcile", s.reconcile, []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleFinance})
}

func toRateCard(c billing.RateCard) adminapi.RateCard {
	out := adminapi.RateCard{Name: c.Name, Version: c.Version, Currency: c.Currency, Prices: map[string]string{}, PricesMicros: c.Prices, CreatedAt: protocol.Time(c.CreatedAt)}
	for k, v := range c.Prices {
		out.Prices[k] = billing.FormatAmount(v)
	}
	return out
}

func (s *Server) createRateCard(c echo.Context) error {
	var req adminapi.RateCardRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	prices := map[string]int64{}
	for size, p := range req.Prices {
		v, err := billing.ParseAmount(p)
		if err != nil {
			return invalid("prices." + size + ": " + err.Error())
		}
		prices[size] = v
	}
	card, err := s.bill.CreateRateCard(c.Request().Context(), req.Name, req.Currency, prices, s.clock.Now())
	if errors.Is(err, billing.ErrCardCurrency) {
		return protocol.E(protocol.Conflict, err.Error())
	}
	if err != nil {
		return invalid(err.Error())
	}
	out := toRateCard(card)
	return answer(c, http.StatusCreated, out, change{target: "rate_card:" + card.Name, after: out}, nil)
}

// setRateCardCurrency is PUT /rate-cards/{name}/currency: it states the
// currency of a card created before cards had one, once.
func (s *Server) setRateCardCurrency(c echo.Context) error {
	var req adminapi.RateCardCurrencyRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	out, ch, err := s.setCardCurrency(c.Request().Context(), c.Param("name"), req.Currency)
	return answer(c, http.StatusOK, out, ch, err)
}

// setCardCurrency sets the currency of a rate card that has none.
func (v *service) setCardCurrency(ctx context.Context, name, currency string) (adminapi.RateCard, change, error) {
	ch := change{target: "rate_card:" + name}
	card, err := v.bill.SetRateCardCurrency(ctx, name, currency)
	switch {
	case errors.Is(err, billing.ErrNoRateCard):
		return adminapi.RateCard{}, ch, protocol.E(protocol.NotFound, "no such rate card")
	case errors.Is(err, billing.ErrCardCurrency):
		return adminapi.RateCard{}, ch, protocol.E(protocol.Conflict, err.Error())
	case err != nil:
		return adminapi.RateCard{}, ch, invalid(err.Error())
	}
	out := toRateCard(card)
	ch.before, ch.after = map[string]string{"currency": ""}, out
	return out, ch, nil
}

func (s *Server) listRateCards(c echo.Context) error {
	cards, err := s.bill.RateCards(c.Request().Context())
	return listed(c, cards, err, toRateCard)
}

func toBillingSettings(st billing.Settings) adminapi.BillingSettings {
	return adminapi.BillingSettings{Configured: st.Configured, RateCard: st.RateCard, Currency: st.Currency,
		CreditLimit: billing.FormatAmount(st.CreditLimitMicros), CreditLimitMicros: st.CreditLimitMicros, Postpaid: st.Postpaid,
		Free: st.Free}
}

func (s *Server) setBilling(c echo.Context) error {
	var req adminapi.BillingSettings
	acct, err := s.accountRequest(c, &req)
	if err != nil {
		return err
	}
	st := billing.Settings{AccountID: acct, RateCard: req.RateCard, Currency: req.Currency, Postpaid: req.Postpaid, Free: req.Free}
	if req.CreditLimit != "" {
		v, err := billing.ParseAmount(req.CreditLimit)
		if err != nil {
			return invalid("credit_limit: " + err.Error())
		}
		st.CreditLimitMicros = v
	}
	out, ch, err := s.setBillingSettings(c.Request().Context(), st, stripeRequest(req))
	return answer(c, http.StatusOK, out, ch, err)
}

// setBillingSettings replaces an account's billing settings, and sets,
// keeps or clears its Stripe sync as sr says.
func (v *service) setBillingSettings(ctx context.Context, st billing.Settings, sr stripeSettings) (adminapi.BillingSettings, change, error) {
	ch := change{target: "account:" + st.AccountID}
	before, err := v.bill.Settings(ctx, st.AccountID)
	if err != nil {
		return adminapi.BillingSettings{}, ch, storeFailed(err)
	}
	sop, err := v.stripePlan(ctx, st.AccountID, sr)
	if err != nil {
		return adminapi.BillingSettings{}, ch, err
	}
	wasBefore := toBillingSettings(before)
	if err := v.withStripe(ctx, st.AccountID, &wasBefore); err != nil {
		return adminapi.BillingSettings{}, ch, storeFailed(err)
	}
	if err := v.bill.SetSettings(ctx, st); errors.Is(err, billing.ErrNoRateCard) {
		return adminapi.BillingSettings{}, ch, protocol.E(protocol.NotFound, "no such rate card")
	} else if err != nil {
		return adminapi.BillingSettings{}, ch, invalid(strings.TrimPrefix(err.Error(), "billing: "))
	}
	if err := v.applyStripe(ctx, st.AccountID, sop); err != nil {
		return adminapi.BillingSettings{}, ch, err
	}
	st.Configured = true
	if st.Free {
		st.Currency, st.Postpaid = billing.NoCurrency, true // as SetSettings stores it
	}
	out := toBillingSettings(st)
	if err := v.withStripe(ctx, st.AccountID, &out); err != nil {
		return adminapi.BillingSettings{}, ch, storeFailed(err)
	}
	ch.before, ch.after = wasBefore, out
	return out, ch, nil
}

func (s *Server) getBilling(c echo.Context) error {
	return accountGet(c, s.service, func(ctx context.Context, acct string) (adminapi.BillingSettings, error) {
		st, err := s.bill.Settings(ctx, acct)
		if err != nil {
			return adminapi.BillingSettings{}, err
		}
		out := toBillingSettings(st)
		return out, s.withStripe(ctx, acct, &out)
	})
}

func (s *Server) adjustFunds(kind string) echo.HandlerFunc {
	return func(c echo.Context) error {
		var req adminapi.FundsRequest
		acct, err := s.accountRequest(c, &req)
		if err != nil {
			return err
		}
		amt, err := billing.ParseAmount(req.Amount)
		if err != nil || amt <= 0 {
			return invalid("amount: a positive decimal with at most 6 fractional digits")
		}
		if req.Reason == "" || len(req.Reason) > 500 {
			return invalid("reason is required (at most 500 characters)")
		}
		out, ch, err := s.adjust(c.Request().Context(), acct, billing.FundsEntry{Key: req.IdempotencyKey, Kind: kind,
			AmountMicros: amt, Reason: req.Reason, Actor: operator(c).Actor(), At: s.clock.Now()})
		return answer(c, http.StatusOK, out, ch, err)
	}
}

// adjust applies a credit or debit to acct's funds (once per key) and
// returns it with the balance after it.
func (v *service) adjust(ctx context.Context, acct string, fe billing.FundsEntry) (adminapi.FundsEntry, change, error) {
	ch := change{target: "account:" + acct}
	e, applied, err := v.bill.Adjust(ctx, acct, fe)
	if errors.Is(err, billing.ErrFundsConflict) {
		return adminapi.FundsEntry{}, ch, protocol.E(protocol.IdempotencyConflict, "this idempotency key was used for a different credit or debit")
	}
	if errors.Is(err, billing.ErrAmountOverflow) {
		return adminapi.FundsEntry{}, ch, invalid("the amount would take the account's credits, debits or balance past the largest amount sandgate holds; nothing was applied")
	}
	if err != nil {
		return adminapi.FundsEntry{}, ch, invalid(err.Error())
	}
	bal, err := v.bill.Balance(ctx, acct)
	if err != nil {
		return adminapi.FundsEntry{}, ch, storeFailed(err)
	}
	out := adminapi.FundsEntry{Kind: e.Kind, Amount: billing.FormatAmount(e.AmountMicros), AmountMicros: e.AmountMicros,
		Currency: e.Currency, Reason: e.Reason, Actor: e.Actor, At: protocol.Time(e.At), Replayed: !applied, Balance: toBalance(bal)}
	ch.after = out
	return out, ch, nil
}

func toBalance(b billing.Balance) adminapi.Balance {
	f := func(m int64) string { return billing.FormatExact(m, b.Currency) }
	return adminapi.Balance{AccountID: b.AccountID, Currency: b.Currency, Postpaid: b.Postpaid,
		Available: f(b.AvailableMicros), Holds: f(b.HoldsMicros), Settled: f(b.SettledMicros), Balance: f(b.BalanceMicros),
		Credits: f(b.CreditsMicros), Debits: f(b.DebitsMicros), CreditLimit: f(b.CreditLimitMicros),
		AvailableMicros: b.AvailableMicros, HoldsMicros: b.HoldsMicros, SettledMicros: b.SettledMicros,
		BalanceMicros: b.BalanceMicros, CreditsMicros: b.CreditsMicros, DebitsMicros: b.DebitsMicros, CreditLimitMicros: b.CreditLimitMicros}
}

func (s *Server) balance(c echo.Context) error {
	return accountGet(c, s.service, func(ctx context.Context, acct string) (adminapi.Balance, error) {
		b, err := s.bill.Balance(ctx, acct)
		return toBalance(b), err
	})
}

func (s *Server) setBudget(c echo.Context) error {
	var req adminapi.BudgetRequest
	acct, err := s.accountRequest(c, &req)
	if err != nil {
		return err
	}
	out, ch, err := s.setMonthlyBudget(c.Request().Context(), acct, req)
	return answer(c, http.StatusOK, out, ch, err)
}

// setMonthlyBudget sets one of acct's budgets and returns them all.
func (v *service) setMonthlyBudget(ctx context.Context, acct string, req adminapi.BudgetRequest) ([]adminapi.Budget, change, error) {
	ch := change{target: "account:" + acct}
	if req.InstanceID != "" {
		in, err := v.instanceByID(ctx, req.InstanceID)
		if err != nil {
			return nil, ch, err
		}
		if in.AccountID != acct {
			return nil, ch, protocol.E(protocol.NotFound, "no such instance in this account")
		}
	}
	amt, err := billing.ParseAmount(req.Monthly)
	if err != nil || amt < 0 {
		return nil, ch, invalid("monthly: a decimal of at least 0 with at most 6 fractional digits")
	}
	bg := billing.Budget{InstanceID: req.InstanceID, Agent: req.Agent, MonthlyMicros: amt, Soft: req.Soft}
	if err := v.bill.SetBudget(ctx, acct, bg); err != nil {
		return nil, ch, invalid(strings.TrimPrefix(err.Error(), "billing: "))
	}
	ch.after = req
	if err := v.account(ctx, acct); err != nil {
		return nil, ch, err
	}
	out, err := v.budgets(ctx, acct)
	if err != nil {
		return nil, ch, storeFailed(err)
	}
	return out, ch, nil
}

func (s *Server) listBudgets(c echo.Context) error {
	return accountGet(c, s.service, s.budgets)
}

// budgets returns acct's budgets with this month's use.
func (v *service) budgets(ctx context.Context, acct string) ([]adminapi.Budget, error) {
	bs, err := v.bill.Budgets(ctx, acct, v.clock.Now())
	if err != nil {
		return nil, err
	}
	out := make([]adminapi.Budget, 0, len(bs))
	for _, b := range bs {
		out = append(out, adminapi.Budget{InstanceID: b.InstanceID, Agent: b.Agent, Monthly: billing.FormatAmount(b.MonthlyMicros),
			MonthlyMicros: b.MonthlyMicros, Soft: b.Soft, Used: billing.FormatAmount(b.UsedMicros), UsedMicros: b.UsedMicros})
	}
	return out, nil
}

// reconcile is GET /billing/reconcile[?account=ID]: every account's (or
// one's) stored funds against its ledgers.
func (s *Server) reconcile(c echo.Context) error {
	note(c).always = true
	out, err := s.reconcileFunds(c.Request().Context(), c.QueryParam("account"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// reconcileFunds reconciles acct's funds, or every account's when acct is "".
func (v *service) reconcileFunds(ctx context.Context, acct string) ([]billing.Report, error) {
	ids, err := v.accountIDs(ctx, acct)
	if err != nil {
		return nil, err
	}
	out := make([]billing.Report, 0, len(ids))
	for _, id := range ids {
		r, err := v.bill.Reconcile(ctx, id)
		if err != nil {
			return nil, storeFailed(err)
		}
		out = append(out, r)
	}
	return out, nil
}

// Adjustment is the appended adjustment entry.
type Adjustment struct {
	Entry    billing.UsageEntry `json:"entry"`
	Replayed bool               `json:"replayed"`
}

func (s *Server) adjustUsage(c echo.Context) error {
	var req adminapi.AdjustmentRequest
	acct, err := s.accountRequest(c, &req)
	if err != nil {
		return err
	}
	amt, err := billing.ParseAmount(req.Amount)
	if err != nil || amt == 0 {
		return invalid("amount: a non-zero decimal with at most 6 fractional digits")
	}
	if strings.TrimSpace(req.Reason) == "" || len(req.Reason) > 500 {
		return invalid("reason is required (at most 500 characters): it goes on the ledger entry, the usage exports and the statement")
	}
	if req.IdempotencyKey == "" || len(req.IdempotencyKey) > 200 {
		return invalid("idempotency_key is required (at most 200 characters)")
	}
	e, appended, err := s.bill.AdjustUsage(c.Request().Context(), acct, billing.UsageAdjustment{Corrects: req.Corrects,
		Key: req.IdempotencyKey, AmountMicros: amt, Reason: req.Reason, Actor: operator(c).Actor(), At: s.clock.Now()})
	if errors.Is(err, billing.ErrNoEntry) {
		return protocol.E(protocol.NotFound, "no such usage ledger entry in this account")
	}
	if errors.Is(err, billing.ErrAdjustmentConflict) {
		return protocol.E(protocol.IdempotencyConflict, "this idempotency key was used for an adjustment of another entry or amount")
	}
	if errors.Is(err, billing.ErrAmountOverflow) {
		return invalid("the amount would take the account's settled total or balance past the largest amount sandgate holds; nothing was applied")
	}
	if errors.Is(err, billing.ErrRefundExceedsEntry) {
		return invalid(strings.TrimPrefix(err.Error(), "billing: ") + "; nothing was applied")
	}
	if err != nil {
		return storeFailed(err)
	}
	n := note(c)
	n.target, n.after = "account:"+acct, map[string]any{"request": req, "entry": e}
	return c.JSON(http.StatusOK, Adjustment{Entry: e, Replayed: !appended})
}
