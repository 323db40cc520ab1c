package admin

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// reasonPattern is a control's reason: a slug clients see as details.reason.
var reasonPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// maxNote bounds a control's note, in characters.
const maxNote = 500

// Default reasons of a pause set without one.
const (
	reasonAccountPaused  = "account_paused"
	reasonInstancePaused = "instance_paused"
)

// newControl validates an operator's reason, note and until and returns
// the control they set, by the request's operator, from now.
func (s *Server) newControl(c echo.Context, reason, note, until string) (*store.Control, error) {
	if !reasonPattern.MatchString(reason) {
		return nil, invalid("reason is required: 1 to 64 characters of [a-z0-9_-], starting with a letter or digit")
	}
	if utf8.RuneCountInString(note) > maxNote {
		return nil, invalid("note must be at most 500 characters")
	}
	now := s.clock.Now()
	ctl := &store.Control{Reason: reason, Note: note, Actor: operator(c).Actor(), Since: now.UnixMilli()}
	if until != "" {
		t, err := time.Parse(time.RFC3339, until)
		if err != nil {
			return nil, invalid("until must be an RFC 3339 time, for example 2026-01-02T15:04:05Z")
		}
		if !t.After(now) {
			return nil, invalid("until must be in the future")
		}
		ctl.Until = t.UnixMilli()
	}
	return ctl, nil
}

func operator(c echo.Context) adminapi.OperatorToken {
	t, _ := c.Get(ctxOperator).(adminapi.OperatorToken)
	return t
}

// account checks that an account exists. Returns NotFound.
func (s *Server) account(ctx context.Context, id string) error {
	if _, err := s.db.Account(ctx, id); errors.Is(err, store.ErrNotFound) {
		return protocol.E(protocol.NotFound, "no such account")
	} else if err != nil {
		return storeFailed(err)
	}
	return nil
}

// instanceByID returns an instance. Returns NotFound.
func (s *Server) instanceByID(ctx context.Context, id string) (sandgate.Instance, error) {
	in, err := s.db.Instance(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return in, protocol.E(protocol.NotFound, "no such instance")
	}
	if err != nil {
		return in, storeFailed(err)
	}
	return in, nil
}

// sweep ends the running workspaces of sc with reason, once; the
// background sweep retries the failures. The sweep outlives the request.
func (s *Server) sweep(c echo.Context, sc termination.Scope, reason sandgate.TerminationReason) (adminapi.Swept, error) {
	n := note(c)
	res, err := s.term.Sweep(context.WithoutCancel(c.Request().Context()), sc, reason)
	n.swept = &res
	if err != nil {
		return adminapi.Swept{}, &protocol.Error{Code: protocol.Internal, Err: err,
			Message: "the change is in force, but the scope's running workspaces could not be listed; the background sweep will end them"}
	}
	if res.Failed > 0 {
		s.log.Warn("workspaces not yet terminated; the background sweep retries", slog.String("reason", string(reason)),
			slog.String(sandgate.KeyAccountID, sc.AccountID), sandgate.InstanceAttr(sc.InstanceID),
			slog.Int("terminated", res.Terminated), slog.Int("failed", res.Failed))
	}
	return adminapi.Swept{Terminated: res.Terminated, Failed: res.Failed}, nil
}

// stop sets or lifts the emergency stop of the broker or of one account.
// Setting it terminates the scope's running workspaces (emergency_stopped).
func (s *Server) stop(c echo.Context) error {
	var req adminapi.StopRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	n := note(c)
	n.target = "broker"
	if req.AccountID != "" {
		n.target = "account:" + req.AccountID
	}
	if req.On == nil {
		return invalid("on is required: true sets the stop, false lifts it")
	}
	on := *req.On
	n.action = map[bool]string{true: "stop.on", false: "stop.off"}[on]
	ctx := c.Request().Context()
	if req.AccountID != "" {
		if err := s.account(ctx, req.AccountID); err != nil {
			return err
		}
	}
	var ctl *store.Control
	if on {
		var err error
		if ctl, err = s.newControl(c, req.Reason, req.Note, req.Until); err != nil {
			return err
		}
	} else if req.Reason != "" || req.Note != "" || req.Until != "" {
		return invalid("reason, note and until apply only when setting a stop (on: true)")
	}
	var before *store.Control
	var err error
	if req.AccountID == "" {
		before, err = s.db.GlobalStop(ctx)
	} else {
		before, err = s.db.Control(ctx, req.AccountID, store.FieldStop)
	}
	if err != nil {
		return storeFailed(err)
	}
	if req.AccountID == "" {
		err = s.db.SetGlobalStop(ctx, ctl)
	} else {
		err = s.db.SetControl(ctx, req.AccountID, store.FieldStop, ctl)
	}
	if err != nil {
		return storeFailed(err)
	}
	now := s.clock.Now()
	n.before, n.after = toControl(before, now), toControl(ctl, now)
	s.log.Info("emergency stop changed", slog.Bool("on", on), slog.String("target", n.target), slog.String("actor", operator(c).Actor()))
	if !on {
		return c.JSON(http.StatusOK, struct{}{})
	}
	res, err := s.sweep(c, termination.Scope{AccountID: req.AccountID}, sandgate.ReasonEmergencyStopped)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

// pauseScope resolves a pause or resume's one target: the account, the
// controls field and the sweep scope.
func (s *Server) pauseScope(c echo.Context, acct, inst string) (string, string, termination.Scope, error) {
	n := note(c)
	switch {
	case (acct == "") == (inst == ""):
		return "", "", termination.Scope{}, invalid("set exactly one of account_id and instance_id")
	case inst != "":
		n.target = "instance:" + inst
		in, err := s.instanceByID(c.Request().Context(), inst)
		if err != nil {
			return "", "", termination.Scope{}, err
		}
		return in.AccountID, store.InstancePauseField(inst), termination.Scope{AccountID: in.AccountID, InstanceID: inst}, nil
	default:
		n.target = "account:" + acct
		if err := s.account(c.Request().Context(), acct); err != nil {
			return "", "", termination.Scope{}, err
		}
		return acct, store.FieldPause, termination.Scope{AccountID: acct}, nil
	}
}

// pause pauses one account or one instance and terminates its running
// workspaces (paused).
func (s *Server) pause(c echo.Context) error {
	var req adminapi.PauseRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	acct, field, sc, err := s.pauseScope(c, req.AccountID, req.InstanceID)
	if err != nil {
		return err
	}
	reason := req.Reason
	if reason == "" {
		reason = reasonAccountPaused
		if sc.InstanceID != "" {
			reason = reasonInstancePaused
		}
	}
	ctl, err := s.newControl(c, reason, req.Note, req.Until)
	if err != nil {
		return err
	}
	if err := s.setControl(c, acct, field, ctl); err != nil {
		return err
	}
	res, err := s.sweep(c, sc, sandgate.ReasonPaused)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

// resume lifts the pause of one account or one instance; the other pauses
// (an account's instances, an instance's account) stay.
func (s *Server) resume(c echo.Context) error {
	var req adminapi.ResumeRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	acct, field, _, err := s.pauseScope(c, req.AccountID, req.InstanceID)
	if err != nil {
		return err
	}
	if err := s.setControl(c, acct, field, nil); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, struct{}{})
}

// setControl sets or clears one controls field and notes it for the audit.
func (s *Server) setControl(c echo.Context, acct, field string, ctl *store.Control) error {
	ctx := c.Request().Context()
	before, err := s.db.Control(ctx, acct, field)
	if err != nil {
		return storeFailed(err)
	}
	if err := s.db.SetControl(ctx, acct, field, ctl); err != nil {
		return storeFailed(err)
	}
	n, now := note(c), s.clock.Now()
	n.before, n.after = toControl(before, now), toControl(ctl, now)
	s.log.Info("pause changed", slog.Bool("on", ctl != nil), slog.String("target", n.target), slog.String("actor", operator(c).Actor()))
	return nil
}

// status lists what is stopped or paused, by whom, since when.
func (s *Server) status(c echo.Context) error {
	ctx := c.Request().Context()
	g, err := s.db.GlobalStop(ctx)
	if err != nil {
		return storeFailed(err)
	}
	all, err := s.db.AllControls(ctx)
	if err != nil {
		return storeFailed(err)
	}
	now := s.clock.Now()
	out := adminapi.Status{BrokerStop: toControl(g, now), Controls: make([]adminapi.ScopedControl, 0, len(all))}
	for _, ac := range all {
		out.Controls = append(out.Controls, adminapi.ScopedControl{
			AccountID: ac.AccountID, InstanceID: ac.InstanceID, Kind: ac.Kind, Control: *toControl(&ac.Control, now),
		})
	}
	slices.SortFunc(out.Controls, func(a, b adminapi.ScopedControl) int {
		return cmp.Or(cmp.Compare(a.AccountID, b.AccountID), cmp.Compare(a.InstanceID, b.InstanceID), cmp.Compare(a.Kind, b.Kind))
	})
	return c.JSON(http.StatusOK, out)
}

// maxRiskLimit bounds the numeric risk limits an operator may set.
const maxRiskLimit = 1_000_000

func (s *Server) setLimits(c echo.Context) error {
	ctx := c.Request().Context()
	acct := c.Param("id")
	if err := s.account(ctx, acct); err != nil {
		return err
	}
	var req adminapi.RiskLimits
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	if req.AcquiresPerMinute < 0 || req.AcquiresPerMinute > maxRiskLimit || req.MaxOpenWorkspaces < 0 || req.MaxOpenWorkspaces > maxRiskLimit {
		return invalid("acquires_per_minute and max_open_workspaces must be 0 (the broker default) to 1000000")
	}
	if _, ok := sandgate.LookupSize(req.MaxSize); req.MaxSize != "" && !ok {
		return invalid("max_size must be empty (the broker default) or one of small, standard, large, xlarge")
	}
	before, err := s.db.Risk(ctx, acct)
	if err != nil {
		return storeFailed(err)
	}
	l := store.RiskLimits{AcquiresPerMinute: req.AcquiresPerMinute, MaxOpenWorkspaces: req.MaxOpenWorkspaces, MaxSize: req.MaxSize}
	if err := s.db.SetRiskLimits(ctx, acct, l); err != nil {
		return storeFailed(err)
	}
	n := note(c)
	n.before, n.after = toRiskLimits(before), req
	return c.JSON(http.StatusOK, req)
}

func (s *Server) getLimits(c echo.Context) error {
	ctx := c.Request().Context()
	acct := c.Param("id")
	if err := s.account(ctx, acct); err != nil {
		return err
	}
	l, err := s.db.Risk(ctx, acct)
	if err != nil {
		return storeFailed(err)
	}
	return c.JSON(http.StatusOK, toRiskLimits(l))
}

func toRiskLimits(l store.RiskLimits) adminapi.RiskLimits {
	return adminapi.RiskLimits{AcquiresPerMinute: l.AcquiresPerMinute, MaxOpenWorkspaces: l.MaxOpenWorkspaces, MaxSize: l.MaxSize}
}
