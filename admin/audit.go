package admin

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// auditNote is what a handler tells the audit middleware about its
// action. The middleware fills the rest: actor, outcome, source.
type auditNote struct {
	action string // from the route; a handler may refine it (stop.on)
	target string // "broker", "account:ID", "instance:ID"
	before any    // the changed object before the action (never a token)
	after  any    // and after it
	swept  *termination.Result
	always bool // audit even a successful read (the audit export)
}

// note returns the request's audit note, for its handler to fill.
func note(c echo.Context) *auditNote {
	if n, ok := c.Get(ctxAudit).(*auditNote); ok {
		return n
	}
	n := &auditNote{}
	c.Set(ctxAudit, n)
	return n
}

// audit writes one audit entry for every request that changes something
// and for every refused one (401, 403, any 4xx or 5xx), whatever its
// method. Successful reads are not audited, except the exports and
// summaries of money and of the log itself; a successful read the
// console makes to show one of its pages (adminapi.WithConsoleRead) is
// not audited either: a page view is no action.
//
// The entry is written once the handler has returned, so a successful
// answer is already on its way: when the entry cannot be written the
// action stands, the failure is logged at Error ("audit write failed")
// and counted (MetricAuditWriteFailures).
func (s *Server) audit(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		n := note(c)
		n.action = s.actions[c.Request().Method+" "+c.Path()]
		if n.action == "" {
			n.action, n.target = "route.unknown", c.Request().URL.Path
		}
		if id := c.Param("id"); id != "" {
			if strings.HasPrefix(c.Path(), "/admin/v1/accounts/") {
				n.target = "account:" + id
			} else if strings.HasPrefix(c.Path(), "/admin/v1/workspaces/") {
				n.target = "workspace:" + id
			} else {
				n.target = "instance:" + id
			}
		}
		err := next(c)
		out := store.AuditOutcome{Status: c.Response().Status}
		if err != nil {
			pe := toProtocolError(err)
			out.Status, out.Code = pe.Code.Status(), string(pe.Code)
		}
		if out.Status < 400 && c.Request().Method == http.MethodGet &&
			(!n.always || adminapi.IsConsoleRead(c.Request().Context())) {
			return err
		}
		if n.swept != nil {
			t, f := n.swept.Terminated, n.swept.Failed
			out.Terminated, out.Failed = &t, &f
		}
		s.writeAudit(c, n, out)
		return err
	}
}

func (s *Server) writeAudit(c echo.Context, n *auditNote, out store.AuditOutcome) {
	e := store.AuditEvent{
		Time: s.clock.Now().UTC(), Actor: "unknown", Action: n.action, Target: n.target, Outcome: out,
		SourceIP: c.RealIP(), UserAgent: truncate(c.Request().UserAgent(), 256), RequestID: requestID(c),
		Before: rawJSON(n.before), After: rawJSON(n.after),
	}
	if t, ok := c.Get(ctxOperator).(adminapi.OperatorToken); ok {
		e.Actor, e.Role = t.Actor(), string(t.Role)
	}
	// The entry is written even when the client has gone away.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), 5*time.Second)
	defer cancel()
	if err := s.db.AppendAudit(ctx, e, s.cfg.AuditRetention); err != nil {
		s.metrics.auditFailures.Add(ctx, 1)
		s.log.Error("audit write failed", slog.String("action", e.Action), slog.String("target", e.Target),
			slog.String("actor", e.Actor), slog.Int(sandgate.KeyStatus, out.Status),
			slog.String(sandgate.KeyRequestID, e.RequestID), slog.Any(sandgate.KeyError, err))
	}
}

func rawJSON(v any) json.RawMessage {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil // only the package's own wire types reach here
	}
	return b
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// auditRange is the after of an audit export: what was exported.
type auditRange struct {
	From    string `json:"from,omitempty"`
	To      string `json:"to,omitempty"`
	Entries int    `json:"entries"`
}

// exportAudit streams the audit entries of [from, to) as JSON lines,
// oldest first, reading the log a page at a time.
func (s *Server) exportAudit(c echo.Context) error {
	n := note(c)
	n.target, n.always = "audit", true
	var from, to time.Time
	if err := queryTime(c, "from", &from); err != nil {
		return err
	}
	if err := queryTime(c, "to", &to); err != nil {
		return err
	}
	if !from.IsZero() && !to.IsZero() && !from.Before(to) {
		return invalid("from must be before to")
	}
	rng := &auditRange{From: c.QueryParam("from"), To: c.QueryParam("to")}
	n.after = rng
	w := c.Response()
	start := func() {
		if !w.Committed {
			w.Header().Set(echo.HeaderContentType, "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
	}
	err := s.db.AuditRange(c.Request().Context(), from, to, 0, func(e []byte) error {
		start()
		if _, err := w.Write(append(e, '\n')); err != nil {
			return err
		}
		rng.Entries++
		if rng.Entries%500 == 0 {
			w.Flush()
		}
		return nil
	})
	if err != nil {
		if w.Committed && c.Request().Context().Err() == nil {
			// The answer is cut short; the client sees a truncated stream.
			s.log.Error("audit export failed midway", slog.Int("entries", rng.Entries),
				slog.String(sandgate.KeyRequestID, requestID(c)), slog.Any(sandgate.KeyError, err))
		}
		return &protocol.Error{Code: protocol.Internal, Message: "the audit log could not be read", Err: err}
	}
	start()
	return nil
}

// record notes what an action changed; a zero field of ch leaves the note's.
func (n *auditNote) record(ch change) {
	if ch.target != "" {
		n.target = ch.target
	}
	if ch.before != nil {
		n.before = ch.before
	}
	if ch.after != nil {
		n.after = ch.after
	}
	if ch.swept != nil {
		n.swept = ch.swept
	}
}

// answer notes ch for the audit log and answers out with status, or err.
func answer(c echo.Context, status int, out any, ch change, err error) error {
	note(c).record(ch)
	if err != nil {
		return err
	}
	return c.JSON(status, out)
}
