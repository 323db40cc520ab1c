package saga_test

import (
	"errors"
	"testing"

	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/saga"
)

// TestUnconfiguredProviderIsNot5xx: a request on a resource whose
// provider is no longer configured is refused before anything runs, with
// a 4xx (403 paused, reason provider_closed), never a 5xx, which the
// client must report for an exec as "may have run".
func TestUnconfiguredProviderIsNot5xx(t *testing.T) {
	e, _ := newEnvInstance(t)
	_, err := e.saga.ProviderOf("removed")
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.Paused || pe.Reason != saga.ReasonProviderClosed || pe.Code.Status() >= 500 {
		t.Errorf("ProviderOf(an unconfigured provider) = %v; want 403 paused, reason %s", err, saga.ReasonProviderClosed)
	}
}
