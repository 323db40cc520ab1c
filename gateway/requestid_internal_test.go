package gateway

import (
	"testing"

	"github.com/sandgate/sandgate/httpapi"

	"github.com/sandgate/sandgate/policy"
)

// TestNewRequestIDs: the ids made ahead, in blocks, are each valid and
// unique, and each response's values are its own: a capacity of one, so an append copies them.
func TestNewRequestIDs(t *testing.T) {
	var s Server
	seen := map[string]bool{}
	for i := range 5 * httpapi.RequestIDBlock {
		v := s.requestIDs.New()
		if len(v) != 1 || cap(v) != 1 || !policy.ValidRequestID(v[0]) || seen[v[0]] {
			t.Fatalf("id %d: %q (cap %d); want one valid, new id", i, v, cap(v))
		}
		seen[v[0]] = true
	}
}
