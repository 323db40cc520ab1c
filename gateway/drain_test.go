package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
)

// TestDrainRefusesNewRequests: once draining, every request is refused
// with 503 unavailable and a Retry-After, so the client retries elsewhere.
func TestDrainRefusesNewRequests(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	cl := h.Client(in.Token)
	ctx := context.Background()
	if _, err := cl.Lease(ctx); err != nil {
		t.Fatalf("lease before draining: %v", err)
	}
	h.Gateway.Drain()
	_, err := cl.Lease(ctx)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusServiceUnavailable || ce.Code != protocol.Unavailable || ce.RetryAfter <= 0 {
		t.Fatalf("lease while draining: %v; want 503 unavailable with Retry-After", err)
	}
}
