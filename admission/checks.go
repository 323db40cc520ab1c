package admission

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
)

// Idempotency claims the request's Idempotency-Key. It runs first, so a
// request whose key is already claimed is answered from the claim and
// admits nothing (spec §Idempotency).
type Idempotency struct {
	TTL time.Duration // how long a claim is kept; at least 7 days
}

// Name implements Check.
func (Idempotency) Name() string { return "idempotency" }

// Arity implements Check.
func (Idempotency) Arity() (int, int) { return 1, 1 }

// Lua implements Check. KEYS[kb + 1] idempotency STRING; ARGV[ab + 1]
// record JSON. The TTL is the script's.
func (c Idempotency) Lua() (string, string) {
	return `local v = redis.call('GET', KEYS[kb + 1])
if v then return {0, I, '` + codeReplay + `', v} end`,
		`redis.call('SET', KEYS[kb + 1], ARGV[ab + 1], 'PX', '` + strconv.FormatInt(c.TTL.Milliseconds(), 10) + `')`
}

// Bind implements Check.
func (c Idempotency) Bind(r *Request) ([]string, []any) {
	rec := store.EncodeIdemRecord(store.IdemRecord{Hash: r.RequestHash, WorkspaceID: r.Workspace.ID, State: store.IdemInProgress})
	return []string{r.Keys.Idempotency}, []any{rec}
}

// StopReader reads the broker-wide stop, which lives outside any account's
// Redis slot.
type StopReader interface {
	GlobalStop(ctx context.Context) (*store.Control, error)
}

// Controls refuses while the broker, the account or the instance is
// stopped or paused. The account's stop and pause are read inside the
// script; the broker-wide stop in Go just before it.
type Controls struct {
	Stops StopReader
}

// Name implements Check.
func (Controls) Name() string { return "controls" }

// Pre implements PreCheck: the broker-wide emergency stop.
func (c Controls) Pre(ctx context.Context, r *Request) error {
	stop, err := c.Stops.GlobalStop(ctx)
	if err != nil {
		return unavailable(err)
	}
	if stop.ActiveAt(r.Now) {
		return refusal(protocol.EmergencyStopped, stop.Reason, 0, "controls")
	}
	return nil
}

// Arity implements Check.
func (Controls) Arity() (int, int) { return 1, 1 }

// Lua implements Check. KEYS[kb + 1] account controls HASH; ARGV[ab + 1]
// instance pause field. A control is decoded only when it is set.
func (Controls) Lua() (string, string) {
	return `local v = redis.call('HMGET', KEYS[kb + 1], '` + store.FieldStop + `', '` + store.FieldPause + `', ARGV[ab + 1])
if v[1] or v[2] or v[3] then
  local now = tonumber(NOW)
  local codes = {'` + string(protocol.EmergencyStopped) + `', '` + string(protocol.Paused) + `', '` + string(protocol.Paused) + `'}
  for i = 1, 3 do
    if v[i] then
      local c = cjson.decode(v[i])
      local untl = tonumber(c['until_ms']) or 0
      if untl == 0 or now < untl then return {0, I, codes[i], c['reason'] or ''} end
    end
  end
end`, ``
}

// Bind implements Check.
func (Controls) Bind(r *Request) ([]string, []any) {
	return []string{r.Keys.Controls}, []any{store.InstancePauseField(r.Workspace.InstanceID)}
}

// Concurrency holds max_concurrent_workspaces: slots are a sorted set
// scored by deadline, and members past theirs are pruned before counting,
// so a gateway that died mid-create cannot leak a slot.
type Concurrency struct {
	PendingTimeout time.Duration // a starting workspace's slot deadline
}

// Name implements Check.
func (Concurrency) Name() string { return "concurrency" }

// Arity implements Check.
func (Concurrency) Arity() (int, int) { return 1, 2 }

// Lua implements Check. KEYS[kb + 1] live ZSET; ARGV[ab + 1] max,
// ARGV[ab + 2] pending deadline (unix ms).
//
// As in Risk, the slots are pruned only when their count reaches the
// limit: a count under it stays under it once pruned, so the decision is
// the one a prune before every count gives, for a command fewer.
func (Concurrency) Lua() (string, string) {
	return `local max = tonumber(ARGV[ab + 1])
if redis.call('ZCARD', KEYS[kb + 1]) >= max then
  redis.call('ZREMRANGEBYSCORE', KEYS[kb + 1], '-inf', NOW)
  if redis.call('ZCARD', KEYS[kb + 1]) >= max then return {0, I, '` + string(protocol.ConcurrencyLimit) + `', ''} end
end`,
		`redis.call('ZADD', KEYS[kb + 1], ARGV[ab + 2], WS)`
}

// Bind implements Check.
func (c Concurrency) Bind(r *Request) ([]string, []any) {
	return []string{r.Keys.Live}, []any{r.Scope.Limits.MaxConcurrentWorkspaces, r.Now.Add(c.PendingTimeout).UnixMilli()}
}

// RiskDefaults are the risk limits of an account whose operator set none.
type RiskDefaults struct {
	AcquiresPerMinute int    // 0 means 120
	MaxOpenWorkspaces int    // 0 means 100
	MaxSize           string // "" means the largest standard size
}

func (d RiskDefaults) withDefaults() RiskDefaults {
	if d.AcquiresPerMinute == 0 {
		d.AcquiresPerMinute = 120
	}
	if d.MaxOpenWorkspaces == 0 {
		d.MaxOpenWorkspaces = 100
	}
	if d.MaxSize == "" {
		d.MaxSize = sandgate.StandardSizes[len(sandgate.StandardSizes)-1].Name
	}
	return d
}

// Risk limits an account across all its instances: acquire velocity per
// minute (sliding window), open workspaces, and a single-request cap on size.
// Operators set per-account limits (store.SetRiskLimits); Defaults apply
// where they set none.
type Risk struct {
	Defaults       RiskDefaults
	PendingTimeout time.Duration
}

// Name implements Check.
func (Risk) Name() string { return "risk" }

// sizeRank is the Lua that sets the local named v to the rank (1 on) of
// the standard size named by the string expression e, or to missing when
// it names none: a chain of comparisons, so that no table is built per
// call.
func sizeRank(v, e string, missing int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "local %s = %d\n", v, missing)
	for i, sz := range sandgate.StandardSizes {
		kw := "elseif"
		if i == 0 {
			kw = "if"
		}
		fmt.Fprintf(&b, "%s %s == %q then %s = %d\n", kw, e, sz.Name, v, i+1)
	}
	b.WriteString("end\n")
	return b.String()
}

// rank is the rank (1 on) of the standard size named name, or 99 when it
// names none.
func rank(name string) int {
	for i, sz := range sandgate.StandardSizes {
		if sz.Name == name {
			return i + 1
		}
	}
	return 99
}

// Arity implements Check.
func (Risk) Arity() (int, int) { return 3, 2 }

// Lua implements Check. KEYS[kb + 1] risk HASH, KEYS[kb + 2] velocity
// ZSET, KEYS[kb + 3] open ZSET; ARGV[ab + 1] pending deadline, ARGV[ab +
// 2] the requested size's rank (99: not a standard size). The defaults
// are the script's.
//
// Each ZSET is pruned (members past their deadline) only when its count
// reaches the limit: a count under the limit stays under it once pruned,
// so the decision is the one a prune before every count gives, each set
// stays bounded by its limit, and an admission under the limits costs two
// commands fewer.
func (c Risk) Lua() (string, string) {
	d := c.Defaults.withDefaults()
	return `local lim = redis.call('HMGET', KEYS[kb + 1], 'velocity', 'open', 'max_size')
local vel = tonumber(lim[1]) or 0
if vel <= 0 then vel = ` + strconv.Itoa(d.AcquiresPerMinute) + ` end
local open = tonumber(lim[2]) or 0
if open <= 0 then open = ` + strconv.Itoa(d.MaxOpenWorkspaces) + ` end
local maxrank = ` + strconv.Itoa(rank(d.MaxSize)%99) + `
if lim[3] and lim[3] ~= '' then
` + sizeRank("r", "lim[3]", 0) + `maxrank = r
end
if tonumber(ARGV[ab + 2]) > maxrank then return {0, I, '` + string(protocol.RiskLimit) + `', 'request_cap'} end
if redis.call('ZCARD', KEYS[kb + 2]) >= vel then
  local now = tonumber(NOW)
  redis.call('ZREMRANGEBYSCORE', KEYS[kb + 2], '-inf', now - 60000)
  if redis.call('ZCARD', KEYS[kb + 2]) >= vel then
    local oldest = redis.call('ZRANGE', KEYS[kb + 2], 0, 0, 'WITHSCORES')
    local wait = 1000
    if oldest[2] then wait = tonumber(oldest[2]) + 60000 - now end
    return {0, I, '` + string(protocol.RiskLimit) + `', 'velocity', wait}
  end
end
if redis.call('ZCARD', KEYS[kb + 3]) >= open then
  redis.call('ZREMRANGEBYSCORE', KEYS[kb + 3], '-inf', NOW)
  if redis.call('ZCARD', KEYS[kb + 3]) >= open then return {0, I, '` + string(protocol.RiskLimit) + `', 'open_workspaces'} end
end`,
		`redis.call('ZADD', KEYS[kb + 2], NOW, WS)
redis.call('ZADD', KEYS[kb + 3], ARGV[ab + 1], WS)`
}

// Bind implements Check.
func (c Risk) Bind(r *Request) ([]string, []any) {
	return []string{r.Keys.Risk, r.Keys.Velocity, r.Keys.Open}, []any{
		r.Now.Add(c.PendingTimeout).UnixMilli(), rank(r.Workspace.Size)}
}

// Record writes the workspace record and indexes it. It refuses nothing and
// runs last, so only an admitted request leaves a record.
type Record struct{}

// Name implements Check.
func (Record) Name() string { return "record" }

// Arity implements Check: its field/value pairs are as many as the
// workspace sets.
func (Record) Arity() (int, int) { return 3, -1 }

// Lua implements Check. KEYS[kb + 1] workspace HASH, KEYS[kb + 2] index ZSET, KEYS[kb + 3] live
// index ZSET; ARGV[ab + 1] created (unix ms), ARGV[ab + 2 .. ab + na] field/value pairs.
func (Record) Lua() (string, string) {
	return ``, `redis.call('HSET', KEYS[kb + 1], unpack(ARGV, ab + 2, ab + na))
redis.call('ZADD', KEYS[kb + 2], ARGV[ab + 1], WS)
redis.call('ZADD', KEYS[kb + 3], ARGV[ab + 1], WS)`
}

// Bind implements Check.
func (Record) Bind(r *Request) ([]string, []any) {
	fields := store.WorkspaceFields(r.Workspace)
	args := make([]any, 0, 3+len(fields))
	args = append(args, r.Workspace.CreatedAt.UnixMilli())
	args = append(args, fields...)
	// The key's hash, so that the reaper can free it if the create's
	// outcome is never confirmed (store.FailCreate).
	return []string{r.Keys.Workspace, r.Keys.Index, r.Keys.LiveIndex}, append(args, "key", r.KeyHash)
}

// Standard returns the pipeline of the spec's order: idempotency claim →
// stop and pause → instance concurrency → (funds, budget: billing) → risk
// → record.
func Standard(stops StopReader, cfg StandardConfig) []Check {
	cs := []Check{
		Idempotency{TTL: cfg.IdempotencyTTL},
		Controls{Stops: stops},
		Concurrency{PendingTimeout: cfg.PendingTimeout},
	}
	cs = append(cs, cfg.Billing...)
	return append(cs, Risk{Defaults: cfg.Risk, PendingTimeout: cfg.PendingTimeout}, Record{})
}

// StandardConfig configures Standard.
type StandardConfig struct {
	IdempotencyTTL time.Duration
	PendingTimeout time.Duration
	Risk           RiskDefaults
	// Billing are the funds and budget checks (billing.Billing.Checks),
	// run after Concurrency and before Risk; nil admits without them.
	Billing []Check
}
