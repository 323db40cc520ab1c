package saga

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
)

// A snapshot the provider refuses as too large, for the instance's quota
// or for its own bound on one snapshot, is a 422 the client does not
// retry: retrying would archive the same directory again and fail again.
// What the provider cannot explain stays a retryable 502.
func TestSnapshotProviderErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want protocol.Code
	}{
		{providers.ErrSnapshotTooLarge, protocol.SnapshotQuotaExceeded},
		{fmt.Errorf("execsnap: %w", providers.ErrFileTooLarge), protocol.SnapshotQuotaExceeded},
		{providers.ErrFileNotFound, protocol.FileNotFound},
		{providers.ErrSandboxGone, protocol.WorkspaceGone},
		{errors.New("vendor: connection reset"), protocol.UpstreamError},
	} {
		var pe *protocol.Error
		if !errors.As(providerError(opSnapshot, tc.err), &pe) || pe.Code != tc.want {
			t.Errorf("snapshot failing with %v = %v; want %s", tc.err, pe, tc.want)
			continue
		}
		if retry := tc.want == protocol.UpstreamError; pe.Code.Retryable() != retry {
			t.Errorf("snapshot failing with %v: retryable %t; want %t", tc.err, pe.Code.Retryable(), retry)
		}
	}
}
