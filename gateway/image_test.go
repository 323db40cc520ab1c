package gateway_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
)

// TestAcquireOCIImage: an OCI reference outside images.allowed is 422
// image_not_allowed like any other image, and a create whose image cannot
// run whatever a retry does (the provider's ErrImageUnavailable) is 422
// image_not_allowed with reason image_unavailable, never a retryable 502.
func TestAcquireOCIImage(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	const allowed = "registry.example.com/tools/python:3.12"
	in := h.NewInstance(adminapi.Scope{Images: []string{"host", allowed}})

	body := acquireBody("other-image")
	body.Image = "registry.example.com/tools/node:22"
	wantError(t, "acquire on an OCI image outside the scope", do(t, h, acquireReq(in.Token, "other", body)),
		422, protocol.ImageNotAllowed)

	h.Provider.OnCreate(func(context.Context, providers.CreateSpec) error {
		return fmt.Errorf("local: create: %w", providers.ErrImageUnavailable)
	})
	body = acquireBody("unavailable")
	body.Image = allowed
	e := wantError(t, "acquire on an image no registry has", do(t, h, acquireReq(in.Token, "unavailable", body)),
		422, protocol.ImageNotAllowed)
	if e.Retryable || e.Details["reason"] != "image_unavailable" {
		t.Errorf("acquire on an unavailable image: retryable %v, details %v; want not retryable, reason image_unavailable", e.Retryable, e.Details)
	}
	h.Provider.OnCreate(nil)
	body = acquireBody("allowed")
	body.Image = allowed
	var ws protocol.Workspace
	wantOK(t, "acquire on an allowed OCI image", do(t, h, acquireReq(in.Token, "allowed", body)), 201, &ws)
	if ws.Image != allowed {
		t.Errorf("workspace image = %q; want %q as requested", ws.Image, allowed)
	}
}
