package store

import (
	"context"
	"fmt"
	"time"
)

// DataDir names the one data directory a provider that keeps its
// sandboxes on the broker's host (the local provider) serves its
// workspaces from, for every broker process on this store.
type DataDir struct {
	ID        string    `json:"id"`   // the directory's own id, kept in it
	Host      string    `json:"host"` // for the operator: where it is
	Path      string    `json:"path"`
	ClaimedAt time.Time `json:"claimed_at"`
}

// ClaimDataDir records d as the data directory of provider, unless one is
// recorded already, and returns the one recorded: d itself, or another
// when its ID differs. The claim is atomic (SET NX), so of two processes
// starting at once with different directories exactly one gets it. It is
// never released: a provider's workspace records stay in the store, and
// only its directory holds their sandboxes.
func (db *DB) ClaimDataDir(ctx context.Context, provider string, d DataDir) (DataDir, error) {
	key := dataDirKey(provider)
	ok, err := db.rdb.SetNX(ctx, key, mustJSON(d), 0).Result()
	if err != nil {
		return DataDir{}, fmt.Errorf("claim data dir: %w", err)
	}
	if ok {
		return d, nil
	}
	var got DataDir
	if err := db.getJSON(ctx, key, &got); err != nil {
		return DataDir{}, fmt.Errorf("claim data dir: %w", err)
	}
	return got, nil
}
