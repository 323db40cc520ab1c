package redistest

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// ScriptHook is a go-redis hook for tests that act on script calls: it
// hands every EVAL and EVALSHA to the function, which sends it (or not)
// with next; every other command and every pipeline passes through. A
// test injects a lost answer, a failure or a resend with it, as Redis or
// go-redis's own retry could.
type ScriptHook func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error

// DialHook implements redis.Hook.
func (ScriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h ScriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			return h(ctx, cmd, next)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (ScriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
