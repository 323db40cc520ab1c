package gateway

import (
	"context"
	"errors"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/token"
)

// authFrom returns the resolved token of an authenticated request.
func authFrom(c echo.Context) store.Auth {
	a, _ := c.Get("auth").(store.Auth)
	return a
}

// authenticate resolves the bearer token to its lease and instance and
// refuses expired, superseded-past-grace and revoked tokens (spec §Credential).
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Request().Header.Get("Authorization")
		scheme, raw, ok := strings.Cut(strings.TrimSpace(h), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return protocol.E(protocol.Unauthenticated, "missing or malformed bearer token")
		}
		tok := sandgate.Secret(strings.TrimSpace(raw))
		if !token.Valid(tok.Reveal(), token.Prefix) {
			return protocol.E(protocol.Unauthenticated, "missing or malformed bearer token")
		}
		a, err := s.resolve(c.Request().Context(), token.Hash(tok))
		if err != nil {
			return err
		}
		now := s.clock.Now()
		switch a.Lease.StateAt(now) {
		case sandgate.LeaseRevoked:
			return protocol.E(protocol.LeaseRevoked, "this token was revoked; install a new token for the instance")
		case sandgate.LeaseExpired:
			return protocol.E(protocol.LeaseExpired, "this token expired; install a new token for the instance")
		case sandgate.LeasePostGrace:
			return protocol.E(protocol.LeaseSuperseded, "this token was rotated and its grace period ended; install the new token")
		}
		c.Set("auth", a)
		return next(c)
	}
}

func (s *Server) resolve(ctx context.Context, hash string) (store.Auth, error) {
	now := s.clock.Now()
	a, ok, gen := s.cache.get(hash, now)
	if ok {
		return a, nil
	}
	_, _, ctlGen := s.controls.cache.get("", now)
	a, err := s.db.AuthByTokenHash(ctx, hash)
	if errors.Is(err, store.ErrNotFound) {
		return store.Auth{}, protocol.E(protocol.Unauthenticated, "unknown token")
	}
	if err != nil {
		if a, ok := s.cache.stale(hash, now); ok {
			return a, nil
		}
		return store.Auth{}, &protocol.Error{Code: protocol.Unavailable, Message: "the broker cannot read its token store; retry shortly", RetryAfter: 1e9, Err: err}
	}
	s.cache.put(hash, a, gen, now)
	s.controls.cache.put(a.Lease.AccountID+"/"+a.Lease.InstanceID, a.Controls, ctlGen, now)
	return a, nil
}
