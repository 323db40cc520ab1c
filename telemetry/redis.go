package telemetry

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// RedisHook returns a go-redis hook that makes one client span per
// command ("redis EVALSHA") and per pipeline ("redis PIPELINE"). Its
// attributes are the command's name and a pipeline's size: never a key,
// an argument or a reply, which carry ids, hashes and records.
func RedisHook(tp trace.TracerProvider) redis.Hook {
	return redisHook{tracer: tp.Tracer(ScopeName + "/store")}
}

type redisHook struct{ tracer trace.Tracer }

var redisSystem = attribute.String("db.system.name", "redis")

func (h redisHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !trace.SpanFromContext(ctx).SpanContext().IsValid() {
			return next(ctx, cmd) // background work with no trace: no root span per command
		}
		op := strings.ToUpper(cmd.Name())
		ctx, span := h.tracer.Start(ctx, "redis "+op, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(redisSystem, attribute.String("db.operation.name", op)))
		err := next(ctx, cmd)
		endRedis(span, err)
		return err
	}
}

func (h redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !trace.SpanFromContext(ctx).SpanContext().IsValid() {
			return next(ctx, cmds)
		}
		ctx, span := h.tracer.Start(ctx, "redis PIPELINE", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(redisSystem, attribute.String("db.operation.name", "PIPELINE"),
				attribute.Int("db.operation.batch.size", len(cmds))))
		err := next(ctx, cmds)
		endRedis(span, err)
		return err
	}
}

// endRedis ends a Redis span; a miss (redis.Nil) is an answer, not an error.
func endRedis(span trace.Span, err error) {
	if err != nil && !errors.Is(err, redis.Nil) {
		span.SetAttributes(attribute.String("error.type", redisErrorType(err)))
		span.SetStatus(codes.Error, redisErrorType(err))
	}
	span.End()
}

// redisErrorType is a bounded class of err: the reply's error prefix
// (ERR, NOSCRIPT, …) or the transport failure, never its text.
func redisErrorType(err error) string {
	var re redis.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &re):
		if p, _, _ := strings.Cut(re.Error(), " "); p != "" && p == strings.ToUpper(p) && len(p) <= 16 {
			return p
		}
		return "reply"
	}
	var ne net.Error
	if errors.As(err, &ne) {
		if ne.Timeout() {
			return "timeout"
		}
		return "network"
	}
	return "other"
}

// Interface guards
var _ redis.Hook = redisHook{}
