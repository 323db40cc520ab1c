package gateway

import (
	"sync"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
)

// maxOwners bounds the owners cache; when full it starts over.
const maxOwners = 1 << 16

// owners remembers which instance each workspace this gateway process
// has seen belongs to, so that an exec reserves its in-flight bytes only
// for a workspace of the caller's (see Server.execOwned) and pays the
// workspace read for that once per workspace: a workspace's instance
// never changes. It is safe for concurrent use.
type owners struct {
	mu sync.Mutex
	m  map[string]string // workspace id -> instance id
}

func (o *owners) get(ws string) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	inst, ok := o.m[ws]
	return inst, ok
}

func (o *owners) put(ws, inst string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil || len(o.m) >= maxOwners {
		o.m = make(map[string]string)
	}
	o.m[ws] = inst
}

// execOwned checks that workspace id exists and belongs to the lease's
// instance before an exec reserves anything: an exec of a workspace that
// is unknown or another instance's is answered as usable answers it
// (404, or the rate limit first), its body unread. A workspace seen
// before costs no round trip; its state is ExecBegin's to check.
func (s *Server) execOwned(c echo.Context, l sandgate.Lease, id string) error {
	if inst, ok := s.owners.get(id); ok && inst == l.InstanceID {
		return nil
	}
	w, err := s.saga.Load(requestCtx(c), l, id, "")
	if err != nil {
		return s.execRefused(c, err)
	}
	s.owners.put(w.ID, w.InstanceID)
	return nil
}
