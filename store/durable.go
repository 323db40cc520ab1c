package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated is returned by a script run through a Durable client
// when fewer replicas than required acknowledged its writes in time. The
// writes are on the primary, but a failover may lose them; the caller
// must fail closed (the admission answers 503 admission_unavailable).
var ErrNotReplicated = errors.New("store: the write was not acknowledged by enough replicas")

// Durable returns rdb whose Lua scripts (Eval, EvalSha) are followed, on
// the same connection and in the same round trip, by WAIT replicas
// timeout: a script returns ErrNotReplicated unless that many replicas
// acknowledged it (docs/scaling.md). Every state change that admits work
// or moves money is a script, so a DB, billing and the admission pipeline
// over a Durable client never act on a write that a failover could lose.
// Other commands pass through unchanged. replicas 0 returns rdb itself.
//
// rdb must be a *redis.Client (one Redis, or Sentinel's failover client)
// or a *redis.ClusterClient, whose script goes straight to the primary of
// its first key's slot.
func Durable(rdb redis.UniversalClient, replicas int, timeout time.Duration) redis.UniversalClient {
	if replicas <= 0 {
		return rdb
	}
	return &durable{UniversalClient: rdb, replicas: replicas, timeout: timeout}
}

type durable struct {
	redis.UniversalClient
	replicas int
	timeout  time.Duration
}

func (d *durable) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return d.run(ctx, keys, func(p redis.Pipeliner) *redis.Cmd { return p.Eval(ctx, script, keys, args...) })
}

func (d *durable) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return d.run(ctx, keys, func(p redis.Pipeliner) *redis.Cmd { return p.EvalSha(ctx, sha, keys, args...) })
}

func (d *durable) run(ctx context.Context, keys []string, queue func(redis.Pipeliner) *redis.Cmd) *redis.Cmd {
	node, err := d.node(ctx, keys)
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	var cmd *redis.Cmd
	wait := redis.NewIntCmd(ctx, "wait", d.replicas, d.timeout.Milliseconds())
	// One pipeline is one connection: WAIT counts the replicas that
	// acknowledged this connection's last write, the script's.
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		cmd = queue(p)
		_ = p.Process(ctx, wait)
		return nil
	})
	if err := cmd.Err(); err != nil {
		if cc, ok := d.UniversalClient.(*redis.ClusterClient); ok && movedOrDown(err) {
			cc.ReloadState(ctx) // the slot moved (a failover): find its new primary
		}
		return cmd
	}
	if err := d.waited(wait); err != nil {
		cmd.SetErr(err)
	}
	return cmd
}

// waited is ErrNotReplicated, wrapped with why, unless wait (a WAIT run
// after a write on its connection) saw d.replicas acknowledge it.
func (d *durable) waited(wait *redis.IntCmd) error {
	if err := wait.Err(); err != nil {
		return fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err)
	}
	if n := wait.Val(); n < int64(d.replicas) {
		return fmt.Errorf("%w: %d of %d within %s", ErrNotReplicated, n, d.replicas, d.timeout)
	}
	return nil
}

// node returns the client of the one server that runs a script on keys.
func (d *durable) node(ctx context.Context, keys []string) (*redis.Client, error) {
	switch c := d.UniversalClient.(type) {
	case *redis.ClusterClient:
		if len(keys) == 0 {
			return nil, errors.New("store: a script on Redis Cluster needs a key to route by")
		}
		return c.MasterForKey(ctx, keys[0])
	case *redis.Client:
		return c, nil
	}
	return nil, fmt.Errorf("store: durable scripts need a *redis.Client or *redis.ClusterClient, not %T", d.UniversalClient)
}

func movedOrDown(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "MOVED ") || strings.HasPrefix(s, "ASK ") || strings.HasPrefix(s, "CLUSTERDOWN") || strings.Contains(s, "connection refused")
}

// pipelinedByNode sends n scripts, the i-th queued by queue(p, i) for the
// primary of key(i), in one pipeline per primary, each pipeline followed
// by WAIT as run's script is. Every script of a pipeline whose WAIT fewer
// replicas acknowledged, or that could not be sent to its primary, is
// handed to failed with why. It returns the first error met, if any.
func (d *durable) pipelinedByNode(ctx context.Context, n int, key func(int) string, queue func(redis.Pipeliner, int), failed func(int, error)) error {
	type batch struct {
		node *redis.Client
		is   []int
	}
	var batches []*batch
	byAddr := map[string]*batch{}
	var first error
	for i := range n {
		node, err := d.node(ctx, []string{key(i)})
		if err != nil {
			failed(i, err)
			first = cmp.Or(first, err)
			continue
		}
		b := byAddr[node.Options().Addr]
		if b == nil {
			b = &batch{node: node}
			byAddr[node.Options().Addr] = b
			batches = append(batches, b)
		}
		b.is = append(b.is, i)
	}
	for _, b := range batches {
		wait := redis.NewIntCmd(ctx, "wait", d.replicas, d.timeout.Milliseconds())
		_, err := b.node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range b.is {
				queue(p, i)
			}
			return p.Process(ctx, wait)
		})
		if cc, ok := d.UniversalClient.(*redis.ClusterClient); ok && err != nil && movedOrDown(err) {
			cc.ReloadState(ctx) // as run does
		}
		werr := d.waited(wait)
		if werr != nil {
			for _, i := range b.is {
				failed(i, werr)
			}
		}
		first = cmp.Or(first, err, werr)
	}
	return first
}
