package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/protocol"
)

// Usage exports, summaries and statements for finance (role finance or
// admin). Every one is audited, successful reads included: they hand out
// tenants' money data.

// usageRoutes adds the finance routes; New calls it with its route helper.
func (s *Server) usageRoutes(route func(method, path, action string, h echo.HandlerFunc, roles []adminapi.Role)) {
	fin := []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleFinance}
	route(http.MethodGet, "/usage", "usage.export", s.exportUsage, fin)
	route(http.MethodGet, "/usage/summary", "usage.summary", s.summarizeUsage, fin)
	route(http.MethodGet, "/accounts/:id/statement", "usage.statement", s.statement, fin)
}

// funds is what statements read balances, credits and holds from:
// billing's journals. nil (no billing) gives statements of usage only
// (funds_included false).
func (s *Server) funds() billing.FundsReader {
	if s.bill == nil {
		return nil
	}
	return s.bill
}

// usageQuery is a usage request's selection, as parsed from its query.
type usageQuery struct {
	filter   billing.ExportFilter
	accounts []string // sorted by id
}

// usageRange is the after of an audited usage read: what was read.
type usageRange struct {
	From     string `json:"from"`
	To       string `json:"to"`
	Account  string `json:"account,omitempty"`
	Instance string `json:"instance,omitempty"`
	Agent    string `json:"agent,omitempty"`
	Size     string `json:"size,omitempty"`
	Format   string `json:"format,omitempty"`
	GroupBy  string `json:"group_by,omitempty"`
	Rows     int64  `json:"rows"`
	// PoolLines counts a summary's warm-pool lines.
	PoolLines int `json:"pool_lines,omitempty"`
}

// parseUsageQuery reads from, to (RFC 3339; each defaults to the current
// UTC calendar month's bound), account, instance and agent. Returns
// InvalidRequest for a bad value, NotFound for an unknown account or
// instance (or an instance of another account).
func (s *Server) parseUsageQuery(c echo.Context) (usageQuery, error) {
	month := billing.MonthOf(s.clock.Now())
	q := usageQuery{filter: billing.ExportFilter{From: month, To: month.AddDate(0, 1, 0),
		InstanceID: c.QueryParam("instance"), Agent: c.QueryParam("agent"), Size: c.QueryParam("size")}}
	if _, ok := sandgate.LookupSize(q.filter.Size); q.filter.Size != "" && !ok {
		return q, invalid("size must be one of small, standard, large, xlarge")
	}
	if err := queryTime(c, "from", &q.filter.From); err != nil {
		return q, err
	}
	if err := queryTime(c, "to", &q.filter.To); err != nil {
		return q, err
	}
	q.filter.From, q.filter.To = q.filter.From.UTC(), q.filter.To.UTC()
	if !q.filter.From.Before(q.filter.To) {
		return q, invalid("from must be before to (each defaults to the current UTC month's bound)")
	}
	var err error
	q.accounts, err = s.usageAccounts(c.Request().Context(), c.QueryParam("account"), q.filter.InstanceID)
	return q, err
}

// usageAccounts returns the accounts a usage read of acct and inst
// (either may be "") covers. Returns NotFound for an unknown account or
// instance, or an instance of another account.
func (v *service) usageAccounts(ctx context.Context, acct, inst string) ([]string, error) {
	if inst != "" {
		in, err := v.instanceByID(ctx, inst)
		if err != nil {
			return nil, err
		}
		if acct != "" && acct != in.AccountID {
			return nil, protocol.E(protocol.NotFound, "no such instance")
		}
		acct = in.AccountID
	}
	return v.accountIDs(ctx, acct)
}

// usageRead parses a usage read's query and notes the range it reads
// as the audit entry's after, for the handler to complete.
func (s *Server) usageRead(c echo.Context) (usageQuery, *usageRange, error) {
	q, err := s.parseUsageQuery(c)
	if err != nil {
		return q, nil, err
	}
	rng := &usageRange{From: q.filter.From.Format(time.RFC3339Nano), To: q.filter.To.Format(time.RFC3339Nano),
		Account: c.QueryParam("account"), Instance: q.filter.InstanceID, Agent: q.filter.Agent, Size: q.filter.Size}
	note(c).after = rng
	return q, rng, nil
}

func (s *Server) ledger() *billing.Ledger { return billing.NewLedger(s.db.Redis()) }

// exportUsage streams the selected ledger entries as CSV (the default) or
// JSON lines, flushing every few hundred rows: memory does not grow with
// the export. A failure once rows are on their way cuts the connection,
// so the client sees a broken transfer, never a short export that looks
// whole.
func (s *Server) exportUsage(c echo.Context) error {
	n := note(c)
	n.target, n.always = "usage", true
	format := billing.FormatCSV
	if v := c.QueryParam("format"); v != "" {
		f, err := billing.ParseFormat(v)
		if err != nil {
			return invalid("format must be csv or jsonl")
		}
		format = f
	}
	q, rng, err := s.usageRead(c)
	if err != nil {
		return err
	}
	rng.Format = string(format)
	w := c.Response()
	h := w.Header()
	h.Set(echo.HeaderContentType, format.ContentType())
	h.Set(echo.HeaderContentDisposition, fmt.Sprintf(`attachment; filename="usage_%s_%s.%s"`,
		q.filter.From.Format("20060102T150405Z"), q.filter.To.Format("20060102T150405Z"), format))
	// The status goes out with the first flushed rows: a failure before
	// them is still an ordinary error answer.
	st, err := billing.Export(c.Request().Context(), s.ledger(), q.accounts, q.filter, format, w)
	rng.Rows = st.Rows
	if err != nil {
		h.Del(echo.HeaderContentDisposition)
		if w.Committed {
			if c.Request().Context().Err() == nil {
				s.log.Error("usage export failed midway", slog.Int64("rows", st.Rows),
					slog.String(sandgate.KeyRequestID, requestID(c)), slog.Any(sandgate.KeyError, err))
			}
			abort(w)
		}
		return &protocol.Error{Code: protocol.Internal, Message: "the usage ledger could not be read", Err: err}
	}
	if !w.Committed {
		w.WriteHeader(http.StatusOK) // a JSONL export of nothing has no byte
	}
	return nil
}

// abort closes the connection under a response already begun, so the
// client sees the transfer fail (no final chunk) rather than end.
func abort(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
	}
}

func (s *Server) summarizeUsage(c echo.Context) error {
	n := note(c)
	n.target, n.always = "usage", true
	by, err := billing.ParseGroupBy(c.QueryParam("group_by"))
	if err != nil {
		return invalid("group_by must be account, instance, agent, size or day")
	}
	q, rng, err := s.usageRead(c)
	if err != nil {
		return err
	}
	rng.GroupBy = string(by)
	rows, err := billing.Summarize(c.Request().Context(), s.ledger(), q.accounts, q.filter, by)
	if errors.Is(err, billing.ErrTooManyGroups) {
		return invalid("too many groups for a summary; narrow the range or use the export")
	} else if err != nil {
		return &protocol.Error{Code: protocol.Internal, Message: "the usage ledger could not be read", Err: err}
	}
	out := adminapi.UsageSummary{From: rng.From, To: rng.To, GroupBy: string(by), Groups: make([]adminapi.SummaryGroup, 0, len(rows))}
	for _, r := range rows {
		rng.Rows += r.Entries
		out.Groups = append(out.Groups, adminapi.SummaryGroup{Key: r.Key, Currency: r.Currency, Entries: r.Entries,
			Workspaces: r.Workspaces, Seconds: r.Seconds, AmountMicros: r.AmountMicros,
			Amount: billing.FormatMinor(r.AmountMicros, r.Currency)})
	}
	if out.Pool, err = s.poolLines(c, q); err != nil {
		return err
	}
	rng.PoolLines = len(out.Pool)
	return c.JSON(http.StatusOK, out)
}

// poolLines are a summary's warm-pool lines (billing.PoolUsage): the
// operator's own cost, so only a read of every account shows them, and
// its size filter applies.
func (s *Server) poolLines(c echo.Context, q usageQuery) ([]adminapi.PoolLine, error) {
	out := []adminapi.PoolLine{}
	if s.bill == nil || c.QueryParam("account") != "" || q.filter.InstanceID != "" || q.filter.Agent != "" {
		return out, nil
	}
	lines, err := s.bill.PoolUsage(c.Request().Context(), q.filter.From, q.filter.To, q.filter.Size)
	if err != nil {
		return nil, &protocol.Error{Code: protocol.Internal, Message: "the warm pools' time could not be read", Err: err}
	}
	for _, l := range lines {
		pl := adminapi.PoolLine{Provider: l.Provider, Size: l.Size, Image: l.Image, Seconds: l.Seconds,
			RateCard: l.RateCard, Currency: l.Currency, AmountMicros: l.AmountMicros}
		if l.Currency != "" {
			pl.Amount = billing.FormatMinor(l.AmountMicros, l.Currency)
		}
		out = append(out, pl)
	}
	return out, nil
}

// statement answers an account's monthly statement (?month=YYYY-MM,
// default the current UTC month).
func (s *Server) statement(c echo.Context) error {
	n := note(c)
	n.always = true
	ctx := c.Request().Context()
	id := c.Param("id")
	if err := s.account(ctx, id); err != nil {
		return err
	}
	now := s.clock.Now()
	month := billing.MonthOf(now)
	if v := c.QueryParam("month"); v != "" {
		m, err := billing.ParseMonth(v)
		if err != nil {
			return invalid("month must be YYYY-MM, for example 2026-10")
		}
		month = m
	}
	n.after = map[string]string{"month": month.Format("2006-01")}
	st, err := billing.BuildStatement(ctx, s.ledger(), s.funds(), id, month, now)
	if err != nil {
		return &protocol.Error{Code: protocol.Internal, Message: "the statement could not be built", Err: err}
	}
	return c.JSON(http.StatusOK, st)
}
