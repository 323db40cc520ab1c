package billing

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// States of an account's billing, as reconcile reports and the operator
// API's account list show them.
const (
	StateConfigured    = "configured"     // billing set: a rate card (or none) in a currency, prepaid or postpaid
	StateFree          = "free"           // marked free on purpose (billing set --free)
	StateNotConfigured = "not_configured" // never configured: its acquires are refused
)

// State is the settings' billing state: StateConfigured, StateFree or
// StateNotConfigured.
func (s Settings) State() string {
	switch {
	case !s.Configured:
		return StateNotConfigured
	case s.Free:
		return StateFree
	}
	return StateConfigured
}

// States returns the billing state of each account of accts, read in one
// pipeline.
func (b *Billing) States(ctx context.Context, accts []string) (map[string]string, error) {
	cmds := make([]*redis.SliceCmd, len(accts))
	_, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, a := range accts {
			cmds[i] = p.HMGet(ctx, settingsKey(a), "configured", "free")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(accts))
	for i, a := range accts {
		v := cmds[i].Val()
		configured, _ := v[0].(string)
		free, _ := v[1].(string)
		out[a] = Settings{Configured: configured == "1", Free: free == "1"}.State()
	}
	return out, nil
}
