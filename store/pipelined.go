package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pipelined returns rdb whose scripts (EvalSha, the call every
// redis.Script makes first) ride go-redis's full-duplex autopipeliner:
// one held connection on which concurrent requests' scripts are written
// together and their replies read together, so that redis-server and the
// broker each wake once for several scripts instead of once for each.
// Every call keeps its own reply and error, and returns when its context
// ends (the script, once written, still runs, as with a plain client
// whose context ends after the write). Other commands, and Eval (a
// script not yet loaded), pass through unchanged.
//
// It applies to one Redis (a *redis.Client, Sentinel's included): any
// other client is returned as it is, as is a Durable one, whose WAIT must
// follow its script on the same connection. The autopipeliner lives as
// long as rdb; closing rdb stops it. rdb's process hooks run beside the
// write, not before it: a hook may observe a script but must not set its
// result or stop it (go-redis's FullDuplex contract), so fault-injecting
// test hooks need the plain client.
func Pipelined(rdb redis.UniversalClient) (redis.UniversalClient, error) {
	c, ok := rdb.(*redis.Client)
	if !ok {
		return rdb, nil
	}
	ap, err := c.AsyncAutoPipelineWithOptions(&redis.AutoPipelineOptions{
		FullDuplex: true,
		// A short gathering window, taken only while other scripts are in
		// flight: a lone request pays nothing.
		MaxFlushDelay: 50 * time.Microsecond,
	})
	if err != nil {
		return nil, fmt.Errorf("redis autopipeline: %w", err)
	}
	return &pipelined{UniversalClient: rdb, ap: ap}, nil
}

type pipelined struct {
	redis.UniversalClient
	ap *redis.AutoPipeliner
}

func (p *pipelined) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if len(args) == 1 {
		switch args[0].(type) {
		case []string, []any, map[string]any, map[string]string:
			// go-redis spreads a lone slice or map: let it.
			return p.UniversalClient.EvalSha(ctx, sha, keys, args...)
		}
	}
	cmdArgs := make([]any, 3+len(keys), 3+len(keys)+len(args))
	cmdArgs[0], cmdArgs[1], cmdArgs[2] = "evalsha", sha, len(keys)
	for i, k := range keys {
		cmdArgs[3+i] = k
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	if err := p.ap.Submit(ctx, cmd).WaitContext(ctx); err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// The batch may still fill cmd in: answer a command of our own.
		out := redis.NewCmd(ctx, cmdArgs...)
		out.SetErr(err)
		return out
	}
	return cmd
}
