// Package telemetry builds the broker's OpenTelemetry tracing from the
// standard OTEL_* environment variables, and the instrumentation the one
// wiring place (cmd/sandgate) puts around Redis, admission, the providers
// and settlement. Span names and attributes carry route templates, names,
// codes, counts and ids only: never a token, argv, env value, stdin,
// output, path or file content.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every tracer and meter the
// broker makes.
const ScopeName = "github.com/sandgate/sandgate"

// Propagator is the one propagation format: W3C traceparent and
// tracestate, accepted from callers and sent to vendors. Baggage is not
// propagated: it would carry a caller's data to the vendors.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Tracing is the process's tracer provider and how to flush it.
type Tracing struct {
	// Provider makes the tracers; a no-op provider when tracing is off.
	Provider trace.TracerProvider
	// Enabled reports whether spans are exported.
	Enabled bool
	// Exporter is "otlp/http", "otlp/grpc" or "" when off.
	Exporter string
	sdk      *sdktrace.TracerProvider
}

// Shutdown flushes the spans not yet exported and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}

// NewTracing builds tracing from the standard OTEL_* variables read with
// getenv:
//
//   - off when OTEL_SDK_DISABLED is true, OTEL_TRACES_EXPORTER is none, or
//     none of OTEL_TRACES_EXPORTER=otlp, OTEL_EXPORTER_OTLP_ENDPOINT and
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set;
//   - OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (or OTEL_EXPORTER_OTLP_PROTOCOL)
//     grpc exports over gRPC, http/protobuf (the default) over HTTP;
//   - the exporters read the endpoint, headers, timeout, compression and
//     TLS variables themselves, the SDK reads OTEL_TRACES_SAMPLER(_ARG)
//     and OTEL_BSP_*, and the resource OTEL_SERVICE_NAME and
//     OTEL_RESOURCE_ATTRIBUTES (service.name defaults to "sandgate").
//
// The exporters read the process environment: getenv decides only whether
// and how tracing is on.
func NewTracing(ctx context.Context, getenv func(string) string, version, instanceID string) (*Tracing, error) {
	off := &Tracing{Provider: noop.NewTracerProvider()}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return off, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return off, nil
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return off, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER %q is not supported (want otlp or none)", exp)
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var (
		exp  sdktrace.SpanExporter
		name string
		err  error
	)
	switch proto {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
		name = "otlp/http"
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
		name = "otlp/grpc"
	default:
		return nil, fmt.Errorf("telemetry: OTLP protocol %q is not supported (want http/protobuf or grpc)", proto)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP trace exporter: %w", err)
	}
	res, err := Resource(ctx, version, instanceID)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{Provider: tp, Enabled: true, Exporter: name, sdk: tp}, nil
}

// Resource describes this process: service.name "sandgate" (unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES says otherwise),
// service.version and service.instance.id (the broker id).
func Resource(ctx context.Context, version, instanceID string) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(
			attribute.String("service.name", "sandgate"),
			attribute.String("service.version", version),
			attribute.String("service.instance.id", instanceID)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}
