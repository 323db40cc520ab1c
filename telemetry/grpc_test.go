package telemetry_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/sandgate/sandgate/telemetry"
)

// TestGRPCDialOptions: a vendor gRPC call is a client span with its
// method and status code, carries the traceparent, and never records the
// status's message.
func TestGRPCDialOptions(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	var gotParent string
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("traceparent"); len(v) > 0 {
			gotParent = v[0]
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	tp, rec := newRecorder(t)
	opts := append(telemetry.GRPCDialOptions(tp), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }))
	cc, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, parent := tp.Tracer("t").Start(context.Background(), "parent")
	hc := healthpb.NewHealthClient(cc)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	// An unknown service: NotFound, whose message names the request's service.
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "SECRET-SERVICE"}); err == nil {
		t.Fatal("Check of an unknown service succeeded")
	}
	parent.End()
	if !strings.Contains(gotParent, parent.SpanContext().TraceID().String()) {
		t.Errorf("the server got traceparent %q; want the caller's trace", gotParent)
	}
	var codes []string
	for _, s := range rec.Ended() {
		if s.Name() != "vendor grpc /grpc.health.v1.Health/Check" {
			continue
		}
		codes = append(codes, attrs(s.Attributes())["rpc.grpc.status_code"])
		if all := fmt.Sprint(s.Attributes(), s.Events(), s.Status()); strings.Contains(all, "SECRET") {
			t.Errorf("the span carries the request or the status message: %s", all)
		}
	}
	if got := strings.Join(codes, ","); got != "OK,NotFound" {
		t.Errorf("status codes of the vendor spans = %q; want OK,NotFound", got)
	}
}
