package gateway

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/token"
)

// authEntry is a resolved token as the auth cache holds it, with what is
// derived from it once per entry: the lease answer's encoding (lease.go).
// An entry is never changed once cached except for lease, which is
// derived from the entry alone (and the state it was encoded for), so
// it goes when the entry does: on every invalidation, and at maxAge.
type authEntry struct {
	store.Auth
	controlsKey string // the key of the lease's controls in Controls' cache
	lease       atomic.Pointer[leaseBody]
	// buckets are the lease's rate limiter buckets (rateLimit), by
	// class, found on the entry's first request of the class: the
	// limiter's, so that a new entry of the lease finds the same.
	buckets [len(limitedClasses)]atomic.Pointer[admission.Bucket]
}

// limitedClasses are the classes limited before their handler (rateLimit),
// whose rate limiter buckets an authEntry keeps. Exec and files are counted
// in their workspace read's pipeline instead.
var limitedClasses = [...]admission.Class{admission.ClassRead, admission.ClassAcquire}

// bucket returns the lease's bucket of class i of limitedClasses.
func (e *authEntry) bucket(l *admission.Limiter, i int) *admission.Bucket {
	if b := e.buckets[i].Load(); b != nil {
		return b
	}
	b := l.Bucket(e.Lease.ID, limitedClasses[i])
	e.buckets[i].Store(b)
	return b
}

// authFrom returns the resolved token of an authenticated request.
func authFrom(c echo.Context) store.Auth {
	if e := authEntryFrom(c); e != nil {
		return e.Auth
	}
	return store.Auth{}
}

// authEntryFrom returns the request's auth entry; nil before authenticate.
func authEntryFrom(c echo.Context) *authEntry {
	if rc := reqOf(c); rc != nil {
		return rc.auth
	}
	return nil
}

// authenticate resolves the bearer token to its lease and instance and
// refuses expired, superseded-past-grace and revoked tokens (spec §Credential).
// ri is the route next serves, the request's (nil: a catch-all's, which
// observe looks up).
func (s *Server) authenticate(ri *routeInfo, next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		rc := reqOf(c)
		if rc != nil {
			rc.route = ri
		}
		h := headerValue(c.Request().Header, "Authorization")
		scheme, raw, ok := strings.Cut(strings.TrimSpace(h), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return protocol.E(protocol.Unauthenticated, "missing or malformed bearer token")
		}
		tok := sandgate.Secret(strings.TrimSpace(raw))
		now := s.requestNow(c)
		e, err := s.resolve(c.Request().Context(), tok, now)
		if err != nil {
			return err
		}
		switch e.Lease.StateAt(now) {
		case sandgate.LeaseRevoked:
			return protocol.E(protocol.LeaseRevoked, "this token was revoked; install a new token for the instance")
		case sandgate.LeaseExpired:
			return protocol.E(protocol.LeaseExpired, "this token expired; install a new token for the instance")
		case sandgate.LeasePostGrace:
			return protocol.E(protocol.LeaseSuperseded, "this token was rotated and its grace period ended; install the new token")
		}
		if rc != nil {
			rc.auth, rc.now = e, now
		}
		return next(c)
	}
}

// requestNow is s.clock's reading for the request's decisions. With the
// system clock it is the reading its latency is measured from (observe),
// as SystemClock spells it: one clock read for both.
func (s *Server) requestNow(c echo.Context) time.Time {
	if rc := reqOf(c); rc != nil && s.systemClock && !rc.start.IsZero() {
		return rc.start.UTC()
	}
	return s.clock.Now()
}

// resolve returns the auth entry of tok: from the cache, or from the
// store. Only a token of the right shape is looked up in the store (and
// so ever cached); a cache hit is on the SHA-256 of a token that had it.
func (s *Server) resolve(ctx context.Context, tok sandgate.Secret, now time.Time) (*authEntry, error) {
	if len(tok.Reveal()) != token.Len { // before hashing: a header can be long
		return nil, protocol.E(protocol.Unauthenticated, "missing or malformed bearer token")
	}
	// The cache is keyed by the token's SHA-256 itself, the store by its
	// hex (token.Hash): a warm request allocates no string for its key,
	// and neither encodes nor hashes the hex's twice as many bytes.
	sum := token.Sum(tok)
	e, ok, gen := s.cache.GetBytes(sum[:], now)
	if ok {
		return e, nil
	}
	key := string(sum[:])
	if !token.Valid(tok.Reveal(), token.Prefix) {
		return nil, protocol.E(protocol.Unauthenticated, "missing or malformed bearer token")
	}
	ctlGen := s.controls.Generation(now)
	a, err := s.db.AuthByTokenHash(ctx, token.HashOf(sum))
	if errors.Is(err, store.ErrNotFound) {
		return nil, protocol.E(protocol.Unauthenticated, "unknown token")
	}
	if err != nil {
		if e, ok := s.cache.Stale(key, now); ok {
			return e, nil
		}
		return nil, &protocol.Error{Code: protocol.Unavailable, Message: "the broker cannot read its token store; retry shortly", RetryAfter: 1e9, Err: err}
	}
	e = &authEntry{Auth: a, controlsKey: admission.ControlsKey(a.Lease.AccountID, a.Lease.InstanceID)}
	s.cache.Put(key, e, gen, now)
	s.controls.Fill(e.controlsKey, a.Controls, ctlGen, now)
	return e, nil
}
