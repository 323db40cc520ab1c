package telemetry

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
)

// The admission and billing metrics.
const (
	// MetricAdmissionDecisions counts admission decisions by outcome:
	// "admitted", "replay", or the refusal's protocol code.
	MetricAdmissionDecisions = "sandgate.admission.decisions"
	// MetricHeld counts the money admission held (each workspace's worst
	// case), in micro-units, by currency.
	MetricHeld = "sandgate.billing.held_micros"
	// AttrOutcomeKey is the attribute of MetricAdmissionDecisions.
	AttrOutcomeKey = "outcome"
	// AttrCurrency is the attribute of the money metrics.
	AttrCurrency = "currency"
)

// Admitter is what Admission instruments (saga.Admitter).
type Admitter interface {
	Admit(ctx context.Context, r *admission.Request) error
}

// Admission returns a with every decision a span ("admission") and a
// point of MetricAdmissionDecisions, and every admitted hold added to
// MetricHeld.
func Admission(a Admitter, tp trace.TracerProvider, m metric.Meter) (Admitter, error) {
	dec, err := m.Int64Counter(MetricAdmissionDecisions, metric.WithUnit("{decision}"),
		metric.WithDescription("Admission decisions, by outcome: admitted, replay or the refusal's code."))
	if err != nil {
		return nil, err
	}
	held, err := m.Int64Counter(MetricHeld, metric.WithUnit("{micro_unit}"),
		metric.WithDescription("Money held at admission (worst cases), in micro-units, by currency."))
	if err != nil {
		return nil, err
	}
	return &admitter{a: a, tracer: tp.Tracer(ScopeName + "/admission"), decisions: dec, held: held}, nil
}

type admitter struct {
	a         Admitter
	tracer    trace.Tracer
	decisions metric.Int64Counter
	held      metric.Int64Counter
}

func (a *admitter) Admit(ctx context.Context, r *admission.Request) error {
	ctx, span := a.tracer.Start(ctx, "admission", trace.WithAttributes(
		attribute.String("sandgate.workspace_id", r.Workspace.ID), attribute.String("sandgate.instance_id", r.Workspace.InstanceID),
		attribute.String("sandgate.size", r.Workspace.Size)))
	defer span.End()
	err := a.a.Admit(ctx, r)
	outcome := "admitted"
	if _, ok := admission.IsReplay(err); ok {
		outcome = "replay"
	} else if err != nil {
		outcome = string(protocol.CodeOf(err))
		var pe *protocol.Error
		if errors.As(err, &pe) && pe.Reason != "" {
			span.SetAttributes(attribute.String("sandgate.admission.reason", pe.Reason))
		}
		if outcome == string(protocol.AdmissionUnavailable) || outcome == string(protocol.Internal) {
			span.SetStatus(codes.Error, outcome)
		}
	}
	span.SetAttributes(attribute.String("sandgate.admission.outcome", outcome))
	a.decisions.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrOutcomeKey, outcome))))
	if err == nil && r.Workspace.Price.HoldMicros > 0 {
		a.held.Add(ctx, r.Workspace.Price.HoldMicros, metric.WithAttributeSet(attribute.NewSet(
			attribute.String(AttrCurrency, Currency(r.Workspace.Price.Currency)))))
	}
	return err
}

// Currency is the currency label of a price: its ISO 4217 code, or "XXX"
// for none (or anything that is not three capital letters, so the label
// set stays bounded).
func Currency(c string) string {
	if len(c) != 3 {
		return "XXX"
	}
	for i := range 3 {
		if c[i] < 'A' || c[i] > 'Z' {
			return "XXX"
		}
	}
	return c
}

// Settler is what Settlement instruments (termination.Settler).
type Settler interface {
	Settle(ctx context.Context, w sandgate.Workspace) error
}

// Settlement returns s with every settlement a span ("billing settle").
// When s also finishes and settles in one step (termination.FinishSettler,
// as billing does), so does the result.
func Settlement(s Settler, tp trace.TracerProvider) Settler {
	st := &settler{s: s, tracer: tp.Tracer(ScopeName + "/billing")}
	if _, ok := s.(finishSettler); ok {
		return finishingSettler{st}
	}
	return st
}

type settler struct {
	s      Settler
	tracer trace.Tracer
}

// finishSettler is termination.FinishSettler.
type finishSettler interface {
	FinishAndSettle(ctx context.Context, w sandgate.Workspace, at time.Time, eg store.Egress) (sandgate.Workspace, error)
}

// finishingSettler is a settler whose wrapped settler also finishes and
// settles in one step (billing does), which it passes through in a span.
type finishingSettler struct{ *settler }

func (s finishingSettler) FinishAndSettle(ctx context.Context, w sandgate.Workspace, at time.Time, eg store.Egress) (sandgate.Workspace, error) {
	ctx, span := s.tracer.Start(ctx, "billing settle", trace.WithAttributes(
		attribute.String("sandgate.workspace_id", w.ID), attribute.String("sandgate.account_id", w.AccountID)))
	defer span.End()
	cur, err := s.s.(finishSettler).FinishAndSettle(ctx, w, at, eg)
	if err != nil {
		span.SetStatus(codes.Error, "settlement failed")
	}
	return cur, err
}

func (s *settler) Settle(ctx context.Context, w sandgate.Workspace) error {
	ctx, span := s.tracer.Start(ctx, "billing settle", trace.WithAttributes(
		attribute.String("sandgate.workspace_id", w.ID), attribute.String("sandgate.account_id", w.AccountID)))
	defer span.End()
	err := s.s.Settle(ctx, w)
	if err != nil {
		span.SetStatus(codes.Error, "settlement failed")
	}
	return err
}
