package saga

import (
	"context"

	"github.com/sandgate/sandgate/store"
)

// CountRefusals adds refused v1 requests to the counts by code the
// operator API reads (GET /admin/v1/refusals). The gateway calls it with
// batches of the refusals it answered.
func (s *Saga) CountRefusals(ctx context.Context, rs []store.Refusal) error {
	return s.db.CountRefusals(ctx, rs)
}
