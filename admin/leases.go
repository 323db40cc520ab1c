package admin

import (
	"cmp"
	"context"
	"log/slog"
	"slices"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/termination"
	"github.com/sandgate/sandgate/token"
)

// The token actions: issue, rotate, end a grace period, revoke. Each
// records the instance's leases before and after it for the audit log.

// leases returns an instance's leases as the operator sees them (prefixes
// and states, never a token), for listings and the audit log.
func (v *service) leases(ctx context.Context, in sandgate.Instance) ([]adminapi.Lease, error) {
	ls, err := v.db.Leases(ctx, in.AccountID, in.ID)
	if err != nil {
		return nil, storeFailed(err)
	}
	now := v.clock.Now()
	out := make([]adminapi.Lease, 0, len(ls))
	for _, l := range ls {
		out = append(out, toLease(l, now))
	}
	slices.SortFunc(out, func(a, b adminapi.Lease) int {
		return cmp.Or(cmp.Compare(a.IssuedAt, b.IssuedAt), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// leaseChange runs act, a change of in's leases, between reading the
// leases before and after it.
func (v *service) leaseChange(ctx context.Context, in sandgate.Instance, act func() error) (change, error) {
	ch := change{target: "instance:" + in.ID}
	var err error
	if ch.before, err = v.leases(ctx, in); err != nil {
		return ch, err
	}
	if err := act(); err != nil {
		return ch, err
	}
	ch.after, err = v.leases(ctx, in)
	return ch, err
}

// issueToken issues a new token of in, superseding the others when rotate.
func (v *service) issueToken(ctx context.Context, in sandgate.Instance, req adminapi.IssueTokenRequest, rotate bool) (adminapi.IssuedToken, change, error) {
	now := v.clock.Now()
	tok := token.New(token.Prefix)
	l := sandgate.Lease{
		ID: sandgate.NewID(sandgate.PrefixLease), TokenHash: token.Hash(tok), TokenPrefix: token.DisplayPrefix(tok),
		InstanceID: in.ID, AccountID: in.AccountID, IssuedAt: now,
	}
	if req.TTLSeconds > 0 {
		l.ExpiresAt = now.Add(sec(req.TTLSeconds))
	}
	grace := v.cfg.Grace
	if req.GraceSeconds > 0 {
		grace = sec(req.GraceSeconds)
	}
	issue := func() error { return storeErr(v.db.IssueLease(ctx, l, rotate, now, grace)) }
	var ch change
	var err error
	if rotate {
		ch, err = v.leaseChange(ctx, in, issue)
	} else if err = issue(); err == nil {
		ch.after = toLease(l, now)
	}
	if err != nil {
		return adminapi.IssuedToken{}, ch, err
	}
	v.log.Info("token issued", sandgate.InstanceAttr(in.ID), slog.String(sandgate.KeyLeaseID, l.ID), slog.Bool("rotate", rotate))
	return adminapi.IssuedToken{Token: tok.Reveal(), LeaseID: l.ID, InstanceID: in.ID, ExpiresAt: protocol.TimePtr(l.ExpiresAt)}, ch, nil
}

// endGrace ends the grace period of in's superseded tokens now.
func (v *service) endGrace(ctx context.Context, in sandgate.Instance) (adminapi.Count, change, error) {
	var n int
	ch, err := v.leaseChange(ctx, in, func() (err error) {
		n, err = v.db.EndGrace(ctx, in.AccountID, in.ID, v.clock.Now())
		return storeErr(err)
	})
	return adminapi.Count{Count: n}, ch, err
}

// revokeLease revokes one token, named by its lease id. Returns NotFound.
func (v *service) revokeLease(ctx context.Context, id, actor string) (adminapi.RevokeResult, change, error) {
	ch := change{target: "lease:" + id}
	if !policy.ValidID(id) {
		return adminapi.RevokeResult{}, ch, protocol.E(protocol.NotFound, "no such lease")
	}
	l, err := v.db.LeaseByID(ctx, id)
	if l, err = found(l, err, "lease"); err != nil {
		return adminapi.RevokeResult{}, ch, err
	}
	in, err := v.instanceByID(ctx, l.InstanceID)
	if err != nil {
		return adminapi.RevokeResult{}, ch, err
	}
	var revoked bool
	ch, err = v.leaseChange(ctx, in, func() (err error) {
		revoked, err = v.db.RevokeLease(ctx, l, v.clock.Now())
		return storeErr(err)
	})
	if err != nil {
		return adminapi.RevokeResult{}, ch, err
	}
	out := adminapi.RevokeResult{}
	if revoked {
		out.Count = 1
	}
	v.log.Info("token revoked", sandgate.InstanceAttr(in.ID), slog.String("lease_id", l.ID), slog.Int("count", out.Count),
		slog.String("actor", actor))
	return out, ch, nil
}

// revoke revokes every token of in and, when terminate, ends its running
// workspaces (lease_revoked).
func (v *service) revoke(ctx context.Context, in sandgate.Instance, terminate bool, actor string) (adminapi.RevokeResult, change, error) {
	var n int
	ch, err := v.leaseChange(ctx, in, func() (err error) {
		n, err = v.db.RevokeLeases(ctx, in.AccountID, in.ID, v.clock.Now())
		return storeErr(err)
	})
	if err != nil {
		return adminapi.RevokeResult{}, ch, err
	}
	v.log.Info("tokens revoked", sandgate.InstanceAttr(in.ID), slog.Int("count", n), slog.String("actor", actor))
	out := adminapi.RevokeResult{Count: n}
	if !terminate {
		return out, ch, nil
	}
	// The reaper keeps ending them should this sweep not finish.
	if err := v.db.MarkRevoked(ctx, in.AccountID, in.ID, v.clock.Now()); err != nil {
		return out, ch, storeFailed(err)
	}
	res, err := v.sweep(ctx, termination.Scope{AccountID: in.AccountID, InstanceID: in.ID}, sandgate.ReasonLeaseRevoked, &ch)
	if err != nil {
		return out, ch, err
	}
	out.Terminated, out.Failed = res.Terminated, res.Failed
	return out, ch, nil
}
