package telemetry

import (
	"context"
	"errors"
	"io"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// GRPCDialOptions returns the dial options of a vendor's gRPC client
// (pass providers.Env.TracerProvider): every call is a client span
// ("vendor grpc /pkg.Service/Method") with its method and status code,
// and carries the W3C traceparent in its metadata. Neither messages nor
// the status's message are recorded: a vendor's message may echo a
// request (a path, a command). Contrib otelgrpc records that message as
// the span's status, which is why the broker has its own.
func GRPCDialOptions(tp trace.TracerProvider) []grpc.DialOption {
	if tp == nil {
		return nil
	}
	tr := tp.Tracer(ScopeName + "/vendor")
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			ctx, span := startGRPC(ctx, tr, method)
			err := invoker(ctx, method, req, reply, cc, opts...)
			endGRPC(span, err)
			return err
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			ctx, span := startGRPC(ctx, tr, method)
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				endGRPC(span, err)
				return nil, err
			}
			return &tracedStream{ClientStream: cs, span: span}, nil
		}),
	}
}

func startGRPC(ctx context.Context, tr trace.Tracer, method string) (context.Context, trace.Span) {
	ctx, span := tr.Start(ctx, "vendor grpc "+method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.String("rpc.method", method)))
	carrier := propagation.MapCarrier{}
	Propagator.Inject(ctx, carrier)
	for k, v := range carrier {
		ctx = metadata.AppendToOutgoingContext(ctx, k, v)
	}
	return ctx, span
}

func endGRPC(span trace.Span, err error) {
	code := status.Code(err)
	span.SetAttributes(attribute.String("rpc.grpc.status_code", code.String()))
	if err != nil {
		span.SetStatus(codes.Error, code.String())
	}
	span.End()
}

// tracedStream ends its span when the stream ends: RecvMsg's first error
// (io.EOF is a clean end).
type tracedStream struct {
	grpc.ClientStream
	span trace.Span
	once sync.Once
}

func (s *tracedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.once.Do(func() {
			if errors.Is(err, io.EOF) {
				endGRPC(s.span, nil)
				return
			}
			endGRPC(s.span, err)
		})
	}
	return err
}
