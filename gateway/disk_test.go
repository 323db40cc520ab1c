package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
)

// TestLeaseDiskAndCapacity: the lease's sizes carry disk_mib where the
// provider has a disk quota, and a create the provider has no capacity for
// is a retryable 503 unavailable, not an upstream error.
func TestLeaseDiskAndCapacity(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Sizes: []string{"small"}})
	h.Provider.SetDiskMiB(1024)
	rep := do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: in.Token})
	var got protocol.LeaseResponse
	wantOK(t, "lease", rep, http.StatusOK, &got)
	if len(got.Sizes) != 1 || got.Sizes[0].DiskMiB != 1024 {
		t.Errorf("lease sizes = %+v; want small with disk_mib 1024", got.Sizes)
	}

	h.Provider.OnCreate(func(context.Context, providers.CreateSpec) error {
		return fmt.Errorf("local: create: %w", providers.ErrNoCapacity)
	})
	rep = do(t, h, acquireReq(in.Token, "full", acquireBody("full")))
	if e := wantError(t, "acquire without capacity", rep, http.StatusServiceUnavailable, protocol.Unavailable); !e.Retryable {
		t.Errorf("acquire without capacity: retryable = false; want true")
	}
	h.Provider.OnCreate(nil)
	acquire(t, h, in.Token, "room-again")
}
