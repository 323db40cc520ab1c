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
// the control they set, by actor, from now.
func (v *service) newControl(actor, reason, note, until string) (*store.Control, error) {
	if !reasonPattern.MatchString(reason) {
		return nil, invalid("reason is required: 1 to 64 characters of [a-z0-9_-], starting with a letter or digit")
	}
	if utf8.RuneCountInString(note) > maxNote {
		return nil, invalid("note must be at most 500 characters")
	}
	now := v.clock.Now()
	ctl := &store.Control{Reason: reason, Note: note, Actor: actor, Since: now.UnixMilli()}
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
func (v *service) account(ctx context.Context, id string) error {
	a, err := v.db.Account(ctx, id)
	_, err = found(a, err, "account")
	return err
}

// instanceByID returns an instance. Returns NotFound.
func (v *service) instanceByID(ctx context.Context, id string) (sandgate.Instance, error) {
	in, err := v.db.Instance(ctx, id)
	return found(in, err, "instance")
}

// found is the answer of a store read of one what: NotFound for
// store.ErrNotFound, unavailable for any other failure.
func found[T any](v T, err error, what string) (T, error) {
	if errors.Is(err, store.ErrNotFound) {
		return v, protocol.E(protocol.NotFound, "no such "+what)
	}
	if err != nil {
		return v, storeFailed(err)
	}
	return v, nil
}

// sweep ends the running workspaces of sc with reason, once, and notes
// it in ch; the background sweep retries the failures. The sweep
// outlives the request.
func (v *service) sweep(ctx context.Context, sc termination.Scope, reason sandgate.TerminationReason, ch *change) (adminapi.Swept, error) {
	res, err := v.term.Sweep(context.WithoutCancel(ctx), sc, reason)
	ch.swept = &res
	if err != nil {
		return adminapi.Swept{}, &protocol.Error{Code: protocol.Internal, Err: err,
			Message: "the change is in force, but the scope's running workspaces could not be listed; the background sweep will end them"}
	}
	if res.Failed > 0 {
		v.log.Warn("workspaces not yet terminated; the background sweep retries", slog.String("reason", string(reason)),
			slog.String(sandgate.KeyAccountID, sc.AccountID), sandgate.InstanceAttr(sc.InstanceID),
			slog.Int("terminated", res.Terminated), slog.Int("failed", res.Failed))
	}
	return adminapi.Swept{Terminated: res.Terminated, Failed: res.Failed}, nil
}

// stopTarget is the audit target of a stop of acct ("" is the broker).
func stopTarget(acct string) string {
	if acct == "" {
		return "broker"
	}
	return "account:" + acct
}

// stop sets or lifts the emergency stop of the broker or of one account.
// Setting it terminates the scope's running workspaces (emergency_stopped).
func (s *Server) stop(c echo.Context) error {
	var req adminapi.StopRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	n := note(c)
	n.target = stopTarget(req.AccountID)
	if req.On == nil {
		return invalid("on is required: true sets the stop, false lifts it")
	}
	on := *req.On
	n.action = map[bool]string{true: "stop.on", false: "stop.off"}[on]
	res, ch, err := s.setStop(c.Request().Context(), req, operator(c).Actor())
	n.record(ch)
	if err != nil {
		return err
	}
	if !on {
		return c.JSON(http.StatusOK, struct{}{})
	}
	return c.JSON(http.StatusOK, res)
}

// setStop sets (req.On true) or lifts the emergency stop of the broker or
// of req.AccountID; setting it ends the scope's running workspaces.
func (v *service) setStop(ctx context.Context, req adminapi.StopRequest, actor string) (adminapi.Swept, change, error) {
	ch := change{target: stopTarget(req.AccountID)}
	on := *req.On
	if req.AccountID != "" {
		if err := v.account(ctx, req.AccountID); err != nil {
			return adminapi.Swept{}, ch, err
		}
	}
	var ctl *store.Control
	if on {
		var err error
		if ctl, err = v.newControl(actor, req.Reason, req.Note, req.Until); err != nil {
			return adminapi.Swept{}, ch, err
		}
	} else if req.Reason != "" || req.Note != "" || req.Until != "" {
		return adminapi.Swept{}, ch, invalid("reason, note and until apply only when setting a stop (on: true)")
	}
	var before *store.Control
	var err error
	if req.AccountID == "" {
		before, err = v.db.GlobalStop(ctx)
	} else {
		before, err = v.db.Control(ctx, req.AccountID, store.FieldStop)
	}
	if err != nil {
		return adminapi.Swept{}, ch, storeFailed(err)
	}
	if req.AccountID == "" {
		err = v.db.SetGlobalStop(ctx, ctl)
	} else {
		err = v.db.SetControl(ctx, req.AccountID, store.FieldStop, ctl)
	}
	if err != nil {
		return adminapi.Swept{}, ch, storeFailed(err)
	}
	now := v.clock.Now()
	ch.before, ch.after = toControl(before, now), toControl(ctl, now)
	v.log.Info("emergency stop changed", slog.Bool("on", on), slog.String("target", ch.target), slog.String("actor", actor))
	if !on {
		return adminapi.Swept{}, ch, nil
	}
	res, err := v.sweep(ctx, termination.Scope{AccountID: req.AccountID}, sandgate.ReasonEmergencyStopped, &ch)
	return res, ch, err
}

// pauseTarget is a pause or resume's one target, resolved.
type pauseTarget struct {
	acct  string // the account whose controls hold the pause
	field string // the controls field
	scope termination.Scope
}

// pauseScope resolves a pause or resume's one target and notes it in ch.
func (v *service) pauseScope(ctx context.Context, acct, inst string, ch *change) (pauseTarget, error) {
	switch {
	case (acct == "") == (inst == ""):
		return pauseTarget{}, invalid("set exactly one of account_id and instance_id")
	case inst != "":
		ch.target = "instance:" + inst
		in, err := v.instanceByID(ctx, inst)
		if err != nil {
			return pauseTarget{}, err
		}
		return pauseTarget{in.AccountID, store.InstancePauseField(inst), termination.Scope{AccountID: in.AccountID, InstanceID: inst}}, nil
	default:
		ch.target = "account:" + acct
		if err := v.account(ctx, acct); err != nil {
			return pauseTarget{}, err
		}
		return pauseTarget{acct, store.FieldPause, termination.Scope{AccountID: acct}}, nil
	}
}

// pause pauses one account or one instance and terminates its running
// workspaces (paused).
func (s *Server) pause(c echo.Context) error {
	var req adminapi.PauseRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	res, ch, err := s.setPause(c.Request().Context(), req, operator(c).Actor())
	return answer(c, http.StatusOK, res, ch, err)
}

// setPause pauses req's account or instance and ends its running workspaces.
func (v *service) setPause(ctx context.Context, req adminapi.PauseRequest, actor string) (adminapi.Swept, change, error) {
	var ch change
	pt, err := v.pauseScope(ctx, req.AccountID, req.InstanceID, &ch)
	if err != nil {
		return adminapi.Swept{}, ch, err
	}
	reason := req.Reason
	if reason == "" {
		reason = reasonAccountPaused
		if pt.scope.InstanceID != "" {
			reason = reasonInstancePaused
		}
	}
	ctl, err := v.newControl(actor, reason, req.Note, req.Until)
	if err != nil {
		return adminapi.Swept{}, ch, err
	}
	if err := v.setControl(ctx, pt, ctl, actor, &ch); err != nil {
		return adminapi.Swept{}, ch, err
	}
	res, err := v.sweep(ctx, pt.scope, sandgate.ReasonPaused, &ch)
	return res, ch, err
}

// resume lifts the pause of one account or one instance; the other pauses
// (an account's instances, an instance's account) stay.
func (s *Server) resume(c echo.Context) error {
	var req adminapi.ResumeRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	ch, err := s.liftPause(c.Request().Context(), req, operator(c).Actor())
	note(c).record(ch)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, struct{}{})
}

// liftPause lifts the pause of req's account or instance.
func (v *service) liftPause(ctx context.Context, req adminapi.ResumeRequest, actor string) (change, error) {
	var ch change
	pt, err := v.pauseScope(ctx, req.AccountID, req.InstanceID, &ch)
	if err != nil {
		return ch, err
	}
	return ch, v.setControl(ctx, pt, nil, actor, &ch)
}

// setControl sets or clears pt's controls field and notes it in ch.
func (v *service) setControl(ctx context.Context, pt pauseTarget, ctl *store.Control, actor string, ch *change) error {
	before, err := v.db.Control(ctx, pt.acct, pt.field)
	if err != nil {
		return storeFailed(err)
	}
	if err := v.db.SetControl(ctx, pt.acct, pt.field, ctl); err != nil {
		return storeFailed(err)
	}
	now := v.clock.Now()
	ch.before, ch.after = toControl(before, now), toControl(ctl, now)
	v.log.Info("pause changed", slog.Bool("on", ctl != nil), slog.String("target", ch.target), slog.String("actor", actor))
	return nil
}

// status lists what is stopped or paused, by whom, since when.
func (s *Server) status(c echo.Context) error {
	out, err := s.controls(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// controls returns the broker's stop and every account's and instance's
// stop or pause.
func (v *service) controls(ctx context.Context) (adminapi.Status, error) {
	g, err := v.db.GlobalStop(ctx)
	if err != nil {
		return adminapi.Status{}, storeFailed(err)
	}
	all, err := v.db.AllControls(ctx)
	if err != nil {
		return adminapi.Status{}, storeFailed(err)
	}
	now := v.clock.Now()
	out := adminapi.Status{BrokerStop: toControl(g, now), Controls: make([]adminapi.ScopedControl, 0, len(all))}
	for _, ac := range all {
		out.Controls = append(out.Controls, adminapi.ScopedControl{
			AccountID: ac.AccountID, InstanceID: ac.InstanceID, Kind: ac.Kind, Control: *toControl(&ac.Control, now),
		})
	}
	slices.SortFunc(out.Controls, func(a, b adminapi.ScopedControl) int {
		return cmp.Or(cmp.Compare(a.AccountID, b.AccountID), cmp.Compare(a.InstanceID, b.InstanceID), cmp.Compare(a.Kind, b.Kind))
	})
	return out, nil
}

// maxRiskLimit bounds the numeric risk limits an operator may set.
const maxRiskLimit = 1_000_000

func (s *Server) setLimits(c echo.Context) error {
	var req adminapi.RiskLimits
	acct, err := s.accountRequest(c, &req)
	if err != nil {
		return err
	}
	if req.AcquiresPerMinute < 0 || req.AcquiresPerMinute > maxRiskLimit || req.MaxOpenWorkspaces < 0 || req.MaxOpenWorkspaces > maxRiskLimit {
		return invalid("acquires_per_minute and max_open_workspaces must be 0 (the broker default) to 1000000")
	}
	if _, ok := sandgate.LookupSize(req.MaxSize); req.MaxSize != "" && !ok {
		return invalid("max_size must be empty (the broker default) or one of small, standard, large, xlarge")
	}
	ch, err := s.setRiskLimits(c.Request().Context(), acct, req)
	return answer(c, http.StatusOK, req, ch, err)
}

// setRiskLimits replaces acct's risk limits.
func (v *service) setRiskLimits(ctx context.Context, acct string, req adminapi.RiskLimits) (change, error) {
	before, err := v.db.Risk(ctx, acct)
	if err != nil {
		return change{}, storeFailed(err)
	}
	l := store.RiskLimits{AcquiresPerMinute: req.AcquiresPerMinute, MaxOpenWorkspaces: req.MaxOpenWorkspaces, MaxSize: req.MaxSize}
	if err := v.db.SetRiskLimits(ctx, acct, l); err != nil {
		return change{}, storeFailed(err)
	}
	return change{before: toRiskLimits(before), after: req}, nil
}

func (s *Server) getLimits(c echo.Context) error {
	return accountGet(c, s.service, func(ctx context.Context, acct string) (adminapi.RiskLimits, error) {
		l, err := s.db.Risk(ctx, acct)
		return toRiskLimits(l), err
	})
}

func toRiskLimits(l store.RiskLimits) adminapi.RiskLimits {
	return adminapi.RiskLimits{AcquiresPerMinute: l.AcquiresPerMinute, MaxOpenWorkspaces: l.MaxOpenWorkspaces, MaxSize: l.MaxSize}
}
