package telemetry

import (
	"context"
	"errors"
	"io"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandgate/sandgate/providers"
)

// The provider metrics. Their attributes are the provider's configured
// name, the operation (one of the Op values) and, on errors, the outcome
// (one of the Outcome values): a bounded set, never an id.
const (
	// MetricProviderDuration is the latency of every provider call, in
	// seconds, by provider and operation.
	MetricProviderDuration = "sandgate.provider.call.duration"
	// MetricProviderErrors counts provider calls that failed, by
	// provider, operation and outcome.
	MetricProviderErrors = "sandgate.provider.call.errors"
)

// Span and metric attribute keys of provider calls.
const (
	AttrProvider  = "sandgate.provider"
	AttrOperation = "sandgate.provider.operation"
	AttrOutcome   = "sandgate.provider.outcome"
)

// Operations of a provider, the values of AttrOperation.
const (
	OpCreate         = "create"
	OpExec           = "exec"
	OpReadFile       = "read_file"
	OpWriteFile      = "write_file"
	OpTerminate      = "terminate"
	OpList           = "list"
	OpSnapshot       = "snapshot"
	OpRestore        = "restore"
	OpDeleteSnapshot = "delete_snapshot"
	OpStartCommand   = "start_command"
	OpReadCommand    = "read_command"
	OpCancelCommand  = "cancel_command"
)

// Outcome classifies a provider call's error into a bounded value: "ok",
// one of the providers' sentinel errors by name, "timeout", "canceled" or
// "error". A benign outcome (a missing file, a sandbox already gone) is an
// answer the caller expected, not a vendor failure.
func Outcome(err error) (outcome string, benign bool) {
	if err == nil {
		return "ok", true
	}
	for _, o := range outcomes {
		if errors.Is(err, o.err) {
			return o.name, o.benign
		}
	}
	return "error", false
}

// outcomes are the errors Outcome names, in the order it tries them.
var outcomes = []struct {
	err    error
	name   string
	benign bool
}{
	{providers.ErrFileNotFound, "file_not_found", true},
	{providers.ErrNotAFile, "not_a_file", true},
	{providers.ErrFileTooLarge, "file_too_large", true},
	{providers.ErrSandboxGone, "sandbox_gone", true},
	{providers.ErrSnapshotGone, "snapshot_gone", true},
	{providers.ErrCommandNotStarted, "command_not_started", false},
	{providers.ErrCommandFenced, "command_fenced", true},
	{context.DeadlineExceeded, "timeout", false},
	{context.Canceled, "canceled", false},
}

// Providers returns set with every provider wrapped so that each call is
// a span ("provider create", …) with the provider's name, the operation
// and its outcome, and is recorded in MetricProviderDuration and
// MetricProviderErrors. A provider's own Commander stays visible to
// runner.For through the wrapper. Close closes the wrapped providers.
func Providers(set *providers.Set, tp trace.TracerProvider, m metric.Meter) (*providers.Set, error) {
	dur, err := m.Float64Histogram(MetricProviderDuration, metric.WithUnit("s"),
		metric.WithDescription("Latency of provider (vendor) calls, by provider and operation."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	if err != nil {
		return nil, err
	}
	errs, err := m.Int64Counter(MetricProviderErrors, metric.WithUnit("{call}"),
		metric.WithDescription("Provider (vendor) calls that failed, by provider, operation and outcome."))
	if err != nil {
		return nil, err
	}
	tr := tp.Tracer(ScopeName + "/providers")
	var entries []providers.Entry
	for _, e := range set.All() {
		w := &provider{p: e.Provider, name: e.Name, tracer: tr, dur: dur, errs: errs}
		e := *e
		if c, ok := e.Provider.(providers.Commander); ok {
			e.Provider = &commander{provider: w, c: c}
		} else {
			e.Provider = w
		}
		entries = append(entries, e)
	}
	return providers.NewSet(set.Default(), entries...)
}

// latencyBuckets are the bucket bounds, in seconds, of every latency
// histogram: from a Redis round trip to a vendor's slow create.
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// provider is one instrumented provider.
type provider struct {
	p      providers.Provider
	name   string
	tracer trace.Tracer
	dur    metric.Float64Histogram
	errs   metric.Int64Counter
}

// call is one provider call in flight.
type call struct {
	pr    *provider
	op    string
	span  trace.Span
	start time.Time
}

func (pr *provider) start(ctx context.Context, op string, attrs ...attribute.KeyValue) (context.Context, *call) {
	attrs = append(attrs, attribute.String(AttrProvider, pr.name), attribute.String(AttrOperation, op))
	ctx, span := pr.tracer.Start(ctx, "provider "+op, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return ctx, &call{pr: pr, op: op, span: span, start: time.Now()}
}

// end records the call's outcome. The error's text is never recorded: a
// vendor's or the host's message may name a path or echo a request.
func (c *call) end(ctx context.Context, err error, attrs ...attribute.KeyValue) {
	outcome, benign := Outcome(err)
	c.span.SetAttributes(append(attrs, attribute.String(AttrOutcome, outcome))...)
	if !benign {
		c.span.SetStatus(codes.Error, outcome)
	}
	c.span.End()
	set := attribute.NewSet(attribute.String(AttrProvider, c.pr.name), attribute.String(AttrOperation, c.op))
	c.pr.dur.Record(ctx, time.Since(c.start).Seconds(), metric.WithAttributeSet(set))
	if err != nil {
		c.pr.errs.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrProvider, c.pr.name),
			attribute.String(AttrOperation, c.op), attribute.String(AttrOutcome, outcome))))
	}
}

func (pr *provider) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	ctx, c := pr.start(ctx, OpCreate, attribute.String("sandgate.workspace_id", spec.WorkspaceID), attribute.String("sandgate.size", spec.Size.Name),
		attribute.Int("sandgate.env_count", len(spec.Env)), attribute.Int("sandgate.egress_domains", len(spec.Egress.AllowedDomains)))
	sb, err := pr.p.Create(ctx, spec)
	c.end(ctx, err)
	return sb, err
}

func (pr *provider) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	ctx, c := pr.start(ctx, OpExec, attribute.Int("sandgate.argc", len(spec.Argv)), attribute.Int("sandgate.stdin_bytes", len(spec.Stdin)))
	res, err := pr.p.Exec(ctx, sb, spec)
	if err != nil {
		c.end(ctx, err)
		return res, err
	}
	c.end(ctx, nil, attribute.Int("sandgate.exit_code", res.ExitCode), attribute.Bool("sandgate.timed_out", res.TimedOut),
		attribute.Int64("sandgate.stdout_bytes", res.StdoutBytes), attribute.Int64("sandgate.stderr_bytes", res.StderrBytes))
	return res, nil
}

func (pr *provider) ReadFile(ctx context.Context, sb providers.Sandbox, path string, max int64, w io.Writer) (int64, error) {
	ctx, c := pr.start(ctx, OpReadFile)
	n, err := pr.p.ReadFile(ctx, sb, path, max, w)
	c.end(ctx, err, attribute.Int64("sandgate.bytes", n))
	return n, err
}

func (pr *provider) WriteFile(ctx context.Context, sb providers.Sandbox, path string, r io.Reader) error {
	ctx, c := pr.start(ctx, OpWriteFile)
	cr := &countReader{r: r}
	err := pr.p.WriteFile(ctx, sb, path, cr)
	c.end(ctx, err, attribute.Int64("sandgate.bytes", cr.n))
	return err
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (pr *provider) Terminate(ctx context.Context, sb providers.Sandbox) error {
	ctx, c := pr.start(ctx, OpTerminate)
	err := pr.p.Terminate(ctx, sb)
	c.end(ctx, err)
	return err
}

func (pr *provider) List(ctx context.Context) ([]providers.Sandbox, error) {
	ctx, c := pr.start(ctx, OpList)
	sbs, err := pr.p.List(ctx)
	c.end(ctx, err, attribute.Int("sandgate.sandboxes", len(sbs)))
	return sbs, err
}

func (pr *provider) Snapshot(ctx context.Context, sb providers.Sandbox, spec providers.SnapshotSpec) (providers.SnapshotRef, error) {
	ctx, c := pr.start(ctx, OpSnapshot)
	ref, err := pr.p.Snapshot(ctx, sb, spec)
	c.end(ctx, err)
	return ref, err
}

func (pr *provider) Restore(ctx context.Context, sb providers.Sandbox, ref providers.SnapshotRef, dir string) error {
	ctx, c := pr.start(ctx, OpRestore)
	err := pr.p.Restore(ctx, sb, ref, dir)
	c.end(ctx, err)
	return err
}

func (pr *provider) DeleteSnapshot(ctx context.Context, ref providers.SnapshotRef) error {
	ctx, c := pr.start(ctx, OpDeleteSnapshot)
	err := pr.p.DeleteSnapshot(ctx, ref)
	c.end(ctx, err)
	return err
}

func (pr *provider) Capabilities() providers.Capabilities { return pr.p.Capabilities() }

func (pr *provider) Close() error { return pr.p.Close() }

// Unwrap returns the provider inside.
func (pr *provider) Unwrap() providers.Provider { return pr.p }

// commander is an instrumented provider that has its own Commander.
type commander struct {
	*provider
	c providers.Commander
}

func (pc *commander) StartCommand(ctx context.Context, sb providers.Sandbox, id string, spec providers.ExecSpec) error {
	ctx, c := pc.start(ctx, OpStartCommand, attribute.Int("sandgate.argc", len(spec.Argv)))
	err := pc.c.StartCommand(ctx, sb, id, spec)
	c.end(ctx, err)
	return err
}

func (pc *commander) ReadCommand(ctx context.Context, sb providers.Sandbox, id string, maxOut int64) (providers.CommandStatus, error) {
	ctx, c := pc.start(ctx, OpReadCommand)
	st, err := pc.c.ReadCommand(ctx, sb, id, maxOut)
	c.end(ctx, err, attribute.String("sandgate.command_state", commandState(st.State)))
	return st, err
}

func (pc *commander) CancelCommand(ctx context.Context, sb providers.Sandbox, id string) error {
	ctx, c := pc.start(ctx, OpCancelCommand)
	err := pc.c.CancelCommand(ctx, sb, id)
	c.end(ctx, err)
	return err
}

func commandState(s providers.CommandState) string {
	if s == providers.CommandAbsent {
		return "absent"
	}
	return string(s)
}

// Interface guards
var (
	_ providers.Provider  = (*provider)(nil)
	_ providers.Provider  = (*commander)(nil)
	_ providers.Commander = (*commander)(nil)
)
