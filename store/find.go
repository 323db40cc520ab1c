package store

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

// FindWorkspace returns the workspace with id, whichever account holds
// it, for the operator API, which names a workspace by id alone. It reads
// one record key per account in one pipelined round trip (each a
// single-key command, so Redis Cluster's slots are never crossed).
// Returns ErrNotFound.
func (db *DB) FindWorkspace(ctx context.Context, id string) (sandgate.Workspace, error) {
	as, err := db.Accounts(ctx)
	if err != nil {
		return sandgate.Workspace{}, err
	}
	if len(as) == 0 {
		return sandgate.Workspace{}, ErrNotFound
	}
	pipe := db.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(as))
	for i, a := range as {
		cmds[i] = pipe.HGetAll(ctx, workspaceKey(a.ID, id))
	}
	if _, err := pipe.Exec(ctx); err != nil && !isNil(err) {
		return sandgate.Workspace{}, err
	}
	for _, c := range cmds {
		if m := c.Val(); len(m) > 0 {
			return parseWorkspace(m)
		}
	}
	return sandgate.Workspace{}, ErrNotFound
}

// Workspaces returns the workspaces of a scope, live or, with all, also
// the terminated ones still within retention: one instance (acct and inst
// set), one account (inst empty), or every account (both empty), each
// instance's in creation order.
func (db *DB) Workspaces(ctx context.Context, acct, inst string, all bool, now time.Time) ([]sandgate.Workspace, error) {
	return db.walkWorkspaces(ctx, acct, inst, !all, now)
}
