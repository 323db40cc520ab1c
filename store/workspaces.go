package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

// IdemRecord is a claimed Idempotency-Key.
type IdemRecord struct {
	Hash        string `json:"h"`              // the canonical request hash
	WorkspaceID string `json:"ws,omitempty"`   // the workspace the key created (acquire)
	SnapshotID  string `json:"snap,omitempty"` // the snapshot the key created (snapshot)
	State       string `json:"st"`             // IdemInProgress or IdemDone
}

// Idempotency record states.
const (
	IdemInProgress = "in_progress"
	IdemDone       = "done"
)

// Operations that take an Idempotency-Key.
const (
	OpAcquire  = "acquire"
	OpSnapshot = "snapshot"
)

// Idempotency returns the record of a claimed key. Returns ErrNotFound.
func (db *DB) Idempotency(ctx context.Context, acct, inst, op, keyHash string) (IdemRecord, error) {
	var r IdemRecord
	err := db.getJSON(ctx, idempotencyKey(acct, inst, op, keyHash), &r)
	return r, err
}

// FreeKey releases a claimed Idempotency-Key, so a retry with it
// re-evaluates: for a request that failed after its claim and left nothing
// a replay could return.
func (db *DB) FreeKey(ctx context.Context, acct, inst, op, keyHash string) error {
	return db.rdb.Del(ctx, idempotencyKey(acct, inst, op, keyHash)).Err()
}

// FreeKeyOf releases a claimed Idempotency-Key if it names workspace id,
// whatever its state: for a create whose workspace a stop or pause ended
// before it was confirmed, which the client never got (a replay would
// answer a workspace that never ran for the key's whole retention). A key
// another request has claimed since is left alone.
func (db *DB) FreeKeyOf(ctx context.Context, acct, inst, op, keyHash, id string) error {
	if err := freeKeyOfScript.Run(ctx, db.rdb, []string{idempotencyKey(acct, inst, op, keyHash)}, id).Err(); err != nil {
		return fmt.Errorf("free the key of %s: %w", id, err)
	}
	return nil
}

// freeKeyOfScript deletes KEYS[1], an idempotency record, if it names
// workspace ARGV[1]. Returns 1 deleted, 0 kept.
var freeKeyOfScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local ok, rec = pcall(cjson.decode, v)
if ok and rec.ws == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// Confirm records that the provider created the workspace's sandbox. It
// returns false when the workspace stopped being starting meanwhile (a
// release, or its pending slot expired); the caller must then terminate
// the sandbox. Either way the Idempotency-Key is marked done.
func (db *DB) Confirm(ctx context.Context, w sandgate.Workspace, providerRef string, startedAt time.Time, keyHash, requestHash string) (bool, error) {
	_, ok, err := db.ConfirmRecord(ctx, w, providerRef, startedAt, keyHash, requestHash)
	return ok, err
}

// ConfirmRecord is Confirm that also returns the workspace's record
// (ErrNotFound when there is none), so an Acquire answers without another
// read. w must be the record admission wrote: once confirmed, the record
// is w with the script's changes, built here; the script answers the
// record only when it refused.
func (db *DB) ConfirmRecord(ctx context.Context, w sandgate.Workspace, providerRef string, startedAt time.Time, keyHash, requestHash string) (sandgate.Workspace, bool, error) {
	keys := []string{
		liveKey(w.AccountID, w.InstanceID),
		workspaceKey(w.AccountID, w.ID),
		idempotencyKey(w.AccountID, w.InstanceID, OpAcquire, keyHash),
		openKey(w.AccountID),
	}
	res, err := confirmScript.Run(ctx, db.rdb, keys, w.ID, ms(w.ExpiresAt), providerRef, ms(startedAt),
		mustJSON(IdemRecord{Hash: requestHash, WorkspaceID: w.ID, State: IdemDone}),
		db.cfg.IdempotencyTTL.Milliseconds()).Slice()
	if err != nil {
		return sandgate.Workspace{}, false, fmt.Errorf("confirm: %w", err)
	}
	if len(res) == 0 {
		return sandgate.Workspace{}, false, fmt.Errorf("confirm: unexpected script result %v", res)
	}
	ok, _ := res[0].(int64)
	if ok == 1 {
		// What the script changed, on the record admission wrote: a
		// starting record changes in nothing else a status answers.
		cur := w
		cur.State, cur.ProviderRef = sandgate.WorkspaceRunning, providerRef
		cur.StartedAt, cur.LastActivity = startedAt, startedAt
		return asStored(cur), true, nil
	}
	if len(res) != 2 {
		return sandgate.Workspace{}, false, fmt.Errorf("confirm: unexpected script result %v", res)
	}
	cur, err := DecodeWorkspace(res[1])
	if err != nil && !errors.Is(err, ErrNotFound) {
		err = fmt.Errorf("confirm: %w", err)
	}
	return cur, false, err
}

// Abort removes an Acquire whose create failed: record, slot, index entry
// and claimed key.
func (db *DB) Abort(ctx context.Context, w sandgate.Workspace, keyHash string) error {
	keys := []string{
		liveKey(w.AccountID, w.InstanceID),
		workspaceKey(w.AccountID, w.ID),
		idempotencyKey(w.AccountID, w.InstanceID, OpAcquire, keyHash),
		workspaceIndexKey(w.AccountID, w.InstanceID),
		openKey(w.AccountID),
		velocityKey(w.AccountID),
		liveIndexKey(w.AccountID, w.InstanceID),
	}
	if err := abortScript.Run(ctx, db.rdb, keys, w.ID).Err(); err != nil {
		return fmt.Errorf("abort: %w", err)
	}
	return nil
}

// Workspace returns a workspace of an account. Returns ErrNotFound.
func (db *DB) Workspace(ctx context.Context, acct, id string) (sandgate.Workspace, error) {
	return db.WorkspacePipelined(ctx, acct, id, nil)
}

// WorkspacePipelined is Workspace with more commands queued (by queue,
// when not nil) on the same round trip, such as a rate check. When queue
// returns an error (a refusal decided without Redis), nothing is sent and
// the error is returned.
func (db *DB) WorkspacePipelined(ctx context.Context, acct, id string, queue func(redis.Pipeliner) error) (sandgate.Workspace, error) {
	pipe := db.rdb.Pipeline()
	if queue != nil {
		if err := queue(pipe); err != nil {
			return sandgate.Workspace{}, err
		}
	}
	return db.workspaceOn(ctx, pipe, acct, id)
}

// workspaceOn reads workspace id of account acct on pipe, with whatever
// pipe already holds, in one round trip.
func (db *DB) workspaceOn(ctx context.Context, pipe redis.Pipeliner, acct, id string) (sandgate.Workspace, error) {
	cmd := pipe.HGetAll(ctx, workspaceKey(acct, id))
	if _, err := pipe.Exec(ctx); err != nil && !isNil(err) && cmd.Err() != nil {
		return sandgate.Workspace{}, err
	}
	m, err := cmd.Result()
	if err != nil {
		return sandgate.Workspace{}, err
	}
	if len(m) == 0 {
		return sandgate.Workspace{}, ErrNotFound
	}
	return parseWorkspace(m)
}

// BeginTerminate marks a workspace terminating with reason and frees its
// slot. It returns the state before the call: "" when there is no record,
// terminating or terminated when termination had already begun (started
// false), starting or running otherwise (started true). A w.ProviderRef
// that the record lacks is stored with it (unless it has ended), so that
// the end is asked of that sandbox whoever finishes it.
func (db *DB) BeginTerminate(ctx context.Context, w sandgate.Workspace, reason sandgate.TerminationReason, now time.Time) (prev sandgate.WorkspaceState, started bool, err error) {
	prev, started, _, err = db.BeginTerminateIf(ctx, w, reason, now, CondNone)
	return prev, started, err
}

// Conditions of BeginTerminateIf, checked in the script against the
// record as it is then.
const (
	CondNone    = ""
	CondExpired = "expired" // running and at or past expires_at
	CondIdle    = "idle"    // running and idle (Workspace.IdleAt) at now
)

// BeginTerminateIf is BeginTerminate that starts only when cond holds at
// now; otherwise it returns the current state with started false. It also
// returns the sandbox the record names once the script ran (ref): w may
// have been read before the create was confirmed, and the end must be
// asked of the record's sandbox.
func (db *DB) BeginTerminateIf(ctx context.Context, w sandgate.Workspace, reason sandgate.TerminationReason, now time.Time, cond string) (prev sandgate.WorkspaceState, started bool, ref string, err error) {
	keys := []string{liveKey(w.AccountID, w.InstanceID), workspaceKey(w.AccountID, w.ID), openKey(w.AccountID)}
	res, err := terminateScript.Run(ctx, db.rdb, keys, w.ID, string(reason), ms(now), cond, "", w.ProviderRef).Slice()
	if err != nil {
		return "", false, "", fmt.Errorf("terminate: %w", err)
	}
	code, _ := res[0].(int64)
	st, _ := res[1].(string)
	if len(res) > 2 {
		ref, _ = res[2].(string)
	}
	prev, started = sandgate.WorkspaceState(st), code == 2
	if started && prev == sandgate.WorkspaceStarting {
		err = db.FreePendingKey(ctx, w.AccountID, w.InstanceID, w.ID)
	}
	return prev, started, ref, err
}

// FreePendingKey frees the Idempotency-Key of a workspace ended before it
// started, if the key is still in progress for it: its create was never
// confirmed (its gateway may have died, or its store failed), and nothing
// else would free the key before its TTL, so a retry would meet
// idempotency_in_progress for days. Freed, a retry is evaluated again, as
// after the reaper fails such a create (FailCreate). A key that is done,
// or names another workspace, is left alone.
func (db *DB) FreePendingKey(ctx context.Context, acct, inst, id string) error {
	idem, err := db.acquireKeyOf(ctx, acct, inst, id)
	if err == nil && idem != "" {
		err = freePendingKeyScript.Run(ctx, db.rdb, []string{idem}, id).Err()
	}
	if err != nil {
		return fmt.Errorf("free the key of %s: %w", id, err)
	}
	return nil
}

// acquireKeyOf returns the Idempotency-Key (its Redis key) that created
// workspace id, as its record names it; "" for no record, or one written
// before keys were recorded.
func (db *DB) acquireKeyOf(ctx context.Context, acct, inst, id string) (string, error) {
	keyHash, err := db.rdb.HGet(ctx, workspaceKey(acct, id), "key").Result()
	if isNil(err) || (err == nil && keyHash == "") {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return idempotencyKey(acct, inst, OpAcquire, keyHash), nil
}

// BeginRelease is BeginTerminate for a client's release of workspace id
// through a token of instance inst: in one round trip it checks that the
// record belongs to inst (ErrNotFound otherwise, and when there is none),
// starts the termination unless it has begun, and returns the record as it
// left it with the state before the call.
func (db *DB) BeginRelease(ctx context.Context, acct, inst, id string, reason sandgate.TerminationReason, now time.Time) (prev sandgate.WorkspaceState, started bool, rec sandgate.Workspace, err error) {
	keys := []string{liveKey(acct, inst), workspaceKey(acct, id), openKey(acct)}
	res, err := terminateScript.Run(ctx, db.rdb, keys, id, string(reason), ms(now), CondNone, inst, "").Slice()
	if err != nil {
		return "", false, sandgate.Workspace{}, fmt.Errorf("release: %w", err)
	}
	code, _ := res[0].(int64)
	if code == 0 || len(res) != 3 {
		return "", false, sandgate.Workspace{}, ErrNotFound
	}
	st, _ := res[1].(string)
	prev, started = sandgate.WorkspaceState(st), code == 2
	if rec, err = DecodeWorkspace(res[2]); err != nil {
		return prev, started, rec, err
	}
	if started {
		// The script's changes, on the record it read: applied here, so
		// that the script does not rebuild the record in Lua.
		rec.State, rec.TerminationReason = sandgate.WorkspaceTerminating, reason
		if reason == sandgate.ReasonReleased && !rec.ExpiresAt.IsZero() && !now.Before(rec.ExpiresAt) {
			rec.TerminationReason = sandgate.ReasonExpired // as the script recorded it
		}
	}
	if started && prev == sandgate.WorkspaceStarting {
		err = db.FreePendingKey(ctx, acct, inst, id)
	}
	return prev, started, rec, err
}

// DecodeWorkspace decodes a workspace record that a script returned as
// HGETALL's flat list of fields and values (a script that splices
// [FinishLua] answers its record so). Returns ErrNotFound for an empty one.
func DecodeWorkspace(v any) (sandgate.Workspace, error) {
	xs, ok := v.([]any)
	if !ok || len(xs)%2 != 0 {
		return sandgate.Workspace{}, fmt.Errorf("store: workspace record: not a field/value list: %T", v)
	}
	if len(xs) == 0 {
		return sandgate.Workspace{}, ErrNotFound
	}
	return parseWorkspaceList(xs)
}

// Egress is what one count of a broker process's egress proxy (Counter)
// holds for a workspace: every byte it counted, out and in, since the
// count began, not only what its record lacks. The scripts that add it
// (AddEgress, and the end's: FinishTerminate, FinishArgs) add only what
// the record does not hold yet of that count, so a count sent twice (a
// retried pipeline, a reply lost after the write) is added once. An end
// that another process recorded first drops it: that end's usage entry is
// written already. A zero Egress (no Counter) adds nothing.
type Egress struct {
	Counter string
	Out, In int64
}

// EgressAdd is one workspace's count, for AddEgress.
type EgressAdd struct {
	AccountID, WorkspaceID string
	Egress
}

// What AddEgress did with each EgressAdd.
const (
	EgressNotAdded = 0  // the workspace is terminating: its end adds them
	EgressAdded    = 1  // on the record
	EgressEnded    = -1 // the workspace has ended, or has no record: nothing will add them
	EgressInDoubt  = 2  // the add failed, or was not acknowledged by the replicas: it may be on the record or not
)

// AddEgress adds each workspace's count to its record while it is
// starting or running, in one round trip (one per primary on Redis
// Cluster), and returns what it did with each, in order. Bytes on the
// record are on the workspace's final usage entry whichever process ends
// it, and survive the process that counted them. Over a Durable client the
// adds are followed by WAIT on each primary, as every script is: an add
// fewer replicas acknowledged is EgressInDoubt.
func (db *DB) AddEgress(ctx context.Context, adds []EgressAdd) ([]int, error) {
	if len(adds) == 0 {
		return nil, nil
	}
	res := make([]int, len(adds))
	cmds := make([]*redis.Cmd, len(adds))
	queue := func(p redis.Pipeliner, i int) {
		a := adds[i]
		// EVAL, not EVALSHA: a pipeline cannot fall back when the
		// script cache is cold; Redis caches the script by its hash.
		cmds[i] = addEgressScript.Eval(ctx, p, []string{workspaceKey(a.AccountID, a.WorkspaceID)}, a.Counter, a.Out, a.In)
	}
	var err error
	if d, ok := db.rdb.(*durable); ok {
		err = d.pipelinedByNode(ctx, len(adds), func(i int) string { return workspaceKey(adds[i].AccountID, adds[i].WorkspaceID) }, queue,
			func(i int, werr error) {
				if cmds[i] == nil {
					cmds[i] = redis.NewCmd(ctx)
				}
				if cmds[i].Err() == nil {
					cmds[i].SetErr(werr)
				}
			})
	} else {
		_, err = db.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range adds {
				queue(p, i)
			}
			return nil
		})
	}
	failed := 0
	for i, c := range cmds {
		n, cerr := c.Int()
		if cerr != nil {
			failed++
			n = EgressInDoubt
		}
		res[i] = n
	}
	if failed == len(adds) && err != nil {
		return nil, fmt.Errorf("add egress: %w", err)
	}
	return res, nil
}

// FinishArgs binds [FinishLua]'s finish_workspace for w's end at at
// adding eg: its keys (the record's, then the instance's live index) and
// its arguments after them (the workspace id, at, retention, the egress
// counter and its bytes out and in).
func (db *DB) FinishArgs(w sandgate.Workspace, at time.Time, eg Egress) (keys [2]string, args []any) {
	return [2]string{workspaceKey(w.AccountID, w.ID), liveIndexKey(w.AccountID, w.InstanceID)},
		[]any{w.ID, ms(at), db.cfg.Retention.Milliseconds(), eg.Counter, eg.Out, eg.In}
}

// FinishTerminate records the provider-confirmed end of a terminating
// workspace, with the egress bytes eg it adds.
func (db *DB) FinishTerminate(ctx context.Context, w sandgate.Workspace, at time.Time, eg Egress) error {
	keys, args := db.FinishArgs(w, at, eg)
	if err := finishScript.Run(ctx, db.rdb, keys[:], args...).Err(); err != nil {
		return fmt.Errorf("finish terminate: %w", err)
	}
	return nil
}

// Touch records activity on a workspace, for the idle timeout.
func (db *DB) Touch(ctx context.Context, w sandgate.Workspace, now time.Time) error {
	return db.rdb.HSet(ctx, workspaceKey(w.AccountID, w.ID), "activity_ms", ms(now)).Err()
}

// LiveCount returns how many slots an instance holds at now.
func (db *DB) LiveCount(ctx context.Context, acct, inst string, now time.Time) (int64, error) {
	return db.rdb.ZCount(ctx, liveKey(acct, inst), "("+strconv.FormatInt(ms(now), 10), "+inf").Result()
}

// ErrBadCursor is returned by ListWorkspaces for a cursor it did not mint.
var ErrBadCursor = errors.New("store: malformed cursor")

// ListWorkspaces pages through an instance's workspaces in creation order.
// With liveOnly, terminated ones are skipped: it walks the instance's live
// index, so they cost nothing. The cursor is opaque: it names the last
// workspace returned, so workspaces created or released during a walk
// never make it repeat or skip one that lives throughout.
func (db *DB) ListWorkspaces(ctx context.Context, acct, inst, cursor string, limit int, liveOnly bool, now time.Time) ([]sandgate.Workspace, string, error) {
	afterScore, afterID, err := parseCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	idx := workspaceIndexKey(acct, inst)
	if liveOnly {
		if err := db.ensureLiveIndex(ctx, acct, inst); err != nil {
			return nil, "", err
		}
		if cursor == "" { // once per walk: what an older broker admitted since
			if _, err := db.liveIDs(ctx, acct, inst, nil); err != nil {
				return nil, "", err
			}
		}
		idx = liveIndexKey(acct, inst)
	} else {
		// Index entries older than retention can only name expired records.
		db.rdb.ZRemRangeByScore(ctx, idx, "-inf", "("+strconv.FormatInt(ms(now.Add(-db.cfg.Retention-24*time.Hour)), 10))
	}
	var out []sandgate.Workspace
	// (score, id) is the last entry walked; each batch starts again at its
	// score, with no offset, so entries added or removed meanwhile never
	// shift the walk (an offset would: the live index loses entries while
	// it is walked, and scores are whole seconds, so hundreds of entries
	// can share one). Only a batch that holds nothing past (score, id), a
	// run of equal scores longer than it, makes the next one larger.
	score, id, seen := afterScore, afterID, cursor != ""
	// Entries that name no record to list leave the index in one call, on
	// the way out.
	var stale []any
	defer func() {
		if len(stale) > 0 {
			db.rdb.ZRem(ctx, idx, stale...)
		}
	}()
	const firstBatch = 100
	for batch := int64(firstBatch); len(out) < limit; {
		zs, err := db.rdb.ZRangeByScoreWithScores(ctx, idx, &redis.ZRangeBy{
			Min: strconv.FormatInt(score, 10), Max: "+inf", Count: batch}).Result()
		if err != nil {
			return nil, "", err
		}
		if len(zs) == 0 {
			return out, "", nil
		}
		pipe := db.rdb.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, len(zs))
		for i, z := range zs {
			m := z.Member.(string)
			if seen && (int64(z.Score) < score || int64(z.Score) == score && m <= id) {
				continue
			}
			cmds[i] = pipe.HGetAll(ctx, workspaceKey(acct, m))
		}
		if _, err := pipe.Exec(ctx); err != nil && !isNil(err) {
			return nil, "", err
		}
		advanced := false
		for i, z := range zs {
			if cmds[i] == nil {
				continue
			}
			score, id, seen, advanced = int64(z.Score), z.Member.(string), true, true
			m := cmds[i].Val()
			if len(m) == 0 {
				stale = append(stale, z.Member) // the record's retention ran out
				continue
			}
			w, err := parseWorkspace(m)
			if err != nil {
				return nil, "", err
			}
			if liveOnly && w.State == sandgate.WorkspaceTerminated {
				stale = append(stale, z.Member) // ended by a broker without the live index
				continue
			}
			out = append(out, w)
			if len(out) == limit {
				return out, makeCursor(score, id), nil
			}
		}
		if int64(len(zs)) < batch {
			return out, "", nil
		}
		if advanced {
			batch = firstBatch
		} else {
			batch *= 2
		}
	}
	return out, "", nil
}

// ensureLiveIndex builds instance inst's live index from its full index,
// once per process and instance: the live index is written by admission
// and finish, so this finds the workspaces of records written before it
// existed (an upgrade over an existing Redis). Each batch is checked and
// added by one script (indexLiveScript), so a workspace ending meanwhile
// is never added. It reads every record within retention of the instance
// once, as each walk of live workspaces did before; a second call in the
// same process costs nothing.
func (db *DB) ensureLiveIndex(ctx context.Context, acct, inst string) error {
	done := acct + "/" + inst
	if _, ok := db.indexed.Load(done); ok {
		return nil
	}
	idx := workspaceIndexKey(acct, inst)
	for cursor := uint64(0); ; {
		kv, next, err := db.rdb.ZScan(ctx, idx, cursor, "", indexBatch).Result()
		if err != nil {
			return fmt.Errorf("build live index: %w", err)
		}
		ids := make([]string, 0, len(kv)/2)
		for i := 0; i < len(kv); i += 2 {
			ids = append(ids, kv[i])
		}
		if err := db.indexLive(ctx, acct, inst, ids); err != nil {
			return err
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	db.indexed.Store(done, struct{}{})
	return nil
}

// indexBatch bounds the workspaces one script or pipeline of a walk
// touches.
const indexBatch = 500

// indexLive adds each workspace of ids that is not terminated to inst's
// live index (indexLiveScript), indexBatch per script.
func (db *DB) indexLive(ctx context.Context, acct, inst string, ids []string) error {
	for len(ids) > 0 {
		n := min(len(ids), indexBatch)
		keys := make([]string, 0, n+1)
		args := make([]any, 0, n)
		keys = append(keys, liveIndexKey(acct, inst))
		for _, id := range ids[:n] {
			keys = append(keys, workspaceKey(acct, id))
			args = append(args, id)
		}
		if err := indexLiveScript.Run(ctx, db.rdb, keys, args...).Err(); err != nil {
			return fmt.Errorf("build live index: %w", err)
		}
		ids = ids[n:]
	}
	return nil
}

// instanceLive returns instance inst's workspaces not yet terminated, in
// creation order: those of its live index, and those holding one of its
// slots that the live index lacks (admitted by a broker without it, during
// an upgrade; they are added to it). It reads only these records: one
// round trip for both sets (which also prunes the full index past
// retention), then one per indexBatch records. Entries of
// the live index whose record is gone or terminated (ended by a broker

// liveIDs returns the ids in instance inst's live index after adding the
// members of its concurrency slots the index lacks: workspaces a broker
// without the live index admitted. queue adds commands to the same round
// trip.
func (db *DB) liveIDs(ctx context.Context, acct, inst string, queue func(redis.Pipeliner)) ([]string, error) {
	pipe := db.rdb.Pipeline()
	if queue != nil {
		queue(pipe)
	}
	indexedCmd := pipe.ZRange(ctx, liveIndexKey(acct, inst), 0, -1)
	slotsCmd := pipe.ZRange(ctx, liveKey(acct, inst), 0, -1)
	if _, err := pipe.Exec(ctx); err != nil && !isNil(err) {
		return nil, err
	}
	ids := indexedCmd.Val()
	nIndexed := len(ids)
	in := make(map[string]bool, nIndexed)
	for _, id := range ids {
		in[id] = true
	}
	for _, id := range slotsCmd.Val() {
		if !in[id] {
			ids = append(ids, id)
		}
	}
	if len(ids) > nIndexed {
		if err := db.indexLive(ctx, acct, inst, ids[nIndexed:]); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// without the live index) are removed from it.
func (db *DB) instanceLive(ctx context.Context, acct, inst string, now time.Time) ([]sandgate.Workspace, error) {
	if err := db.ensureLiveIndex(ctx, acct, inst); err != nil {
		return nil, err
	}
	lidx := liveIndexKey(acct, inst)
	ids, err := db.liveIDs(ctx, acct, inst, func(pipe redis.Pipeliner) {
		// The full index's entries older than retention, as ListWorkspaces
		// prunes them: the background walks keep it bounded.
		pipe.ZRemRangeByScore(ctx, workspaceIndexKey(acct, inst), "-inf", "("+strconv.FormatInt(ms(now.Add(-db.cfg.Retention-24*time.Hour)), 10))
	})
	if err != nil {
		return nil, err
	}
	out := make([]sandgate.Workspace, 0, len(ids))
	var stale []any
	for start := 0; start < len(ids); start += indexBatch {
		part := ids[start:min(len(ids), start+indexBatch)]
		pipe := db.rdb.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, len(part))
		for i, id := range part {
			cmds[i] = pipe.HGetAll(ctx, workspaceKey(acct, id))
		}
		if _, err := pipe.Exec(ctx); err != nil && !isNil(err) {
			return nil, err
		}
		for i, c := range cmds {
			m := c.Val()
			if len(m) == 0 {
				stale = append(stale, part[i])
				continue
			}
			w, err := parseWorkspace(m)
			if err != nil {
				return nil, err
			}
			if w.State == sandgate.WorkspaceTerminated {
				stale = append(stale, part[i])
				continue
			}
			out = append(out, w)
		}
	}
	if len(stale) > 0 {
		if err := db.rdb.ZRem(ctx, lidx, stale...).Err(); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(out, func(a, b sandgate.Workspace) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

func makeCursor(score int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(score, 10) + ":" + id))
}

func parseCursor(c string) (int64, string, error) {
	if c == "" {
		return 0, "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, "", ErrBadCursor
	}
	s, id, ok := strings.Cut(string(b), ":")
	if !ok || id == "" {
		return 0, "", ErrBadCursor
	}
	score, err := strconv.ParseInt(s, 10, 64)
	if err != nil || score < 0 {
		return 0, "", ErrBadCursor
	}
	return score, id, nil
}

// WorkspaceFields flattens a workspace into HSET field/value pairs, for
// the admission script that writes the record. A field whose value is
// empty or zero is left out: a record reads it back as such
// (parseWorkspace), and every read and script of the record costs less.
func WorkspaceFields(w sandgate.Workspace) []any {
	out := make([]any, 0, 2*len(workspaceFieldNames))
	str := func(k, v string) {
		if v != "" {
			out = append(out, k, v)
		}
	}
	num := func(k string, v int64) {
		if v != 0 {
			out = append(out, k, v)
		}
	}
	at := func(k string, t time.Time) {
		if !t.IsZero() {
			out = append(out, k, ms(t))
		}
	}
	out = append(out, "id", w.ID, "state", string(w.State))
	str("account", w.AccountID)
	str("instance", w.InstanceID)
	str("label", w.Label)
	str("size", w.Size)
	str("image", w.Image)
	str("agent", w.Agent)
	str("run_id", w.RunID)
	str("provider", w.Provider)
	str("provider_ref", w.ProviderRef)
	at("created_ms", w.CreatedAt)
	at("expires_ms", w.ExpiresAt)
	num("idle_ms", w.IdleTimeout.Milliseconds())
	at("activity_ms", w.LastActivity)
	at("terminated_ms", w.TerminatedAt)
	str("reason", string(w.TerminationReason))
	str("rate_card", w.Price.RateCard)
	num("rate_card_version", int64(w.Price.RateCardVersion))
	str("currency", w.Price.Currency)
	num("price_micros", w.Price.UnitMicros)
	num("hold_micros", w.Price.HoldMicros)
	str("allowed_domains", w.Domains)
	return out
}

// workspaceFieldNames are the fields WorkspaceFields may write.
var workspaceFieldNames = [...]string{"id", "state", "account", "instance", "label", "size", "image", "agent", "run_id",
	"provider", "provider_ref", "created_ms", "expires_ms", "idle_ms", "activity_ms", "terminated_ms", "reason",
	"rate_card", "rate_card_version", "currency", "price_micros", "hold_micros", "allowed_domains"}

// asStored returns w as a read of its record answers it (parseWorkspace):
// times in UTC at millisecond precision, durations in milliseconds. A
// script that only makes known changes to a record answers no record;
// its caller applies the changes to the record it has and returns this.
func asStored(w sandgate.Workspace) sandgate.Workspace {
	t := func(v time.Time) time.Time {
		if v.IsZero() {
			return time.Time{}
		}
		return fromMS(ms(v))
	}
	w.CreatedAt, w.StartedAt, w.ExpiresAt = t(w.CreatedAt), t(w.StartedAt), t(w.ExpiresAt)
	w.LastActivity, w.BusyUntil, w.TerminatedAt = t(w.LastActivity), t(w.BusyUntil), t(w.TerminatedAt)
	w.IdleTimeout = time.Duration(w.IdleTimeout.Milliseconds()) * time.Millisecond
	return w
}

// Finished returns the record of w, read after its termination began and
// with the egress bytes its end adds counted in, as [FinishLua]'s
// finish_workspace of its end at at leaves it (state terminated,
// terminated_ms at), without reading it: no other change of a
// terminating record touches what a status answers.
func Finished(w sandgate.Workspace, at time.Time) sandgate.Workspace {
	w.State, w.TerminatedAt = sandgate.WorkspaceTerminated, at
	return asStored(w)
}

func parseWorkspace(m map[string]string) (sandgate.Workspace, error) {
	var w sandgate.Workspace
	for k, v := range m {
		setWorkspaceField(&w, k, v)
	}
	return checkParsed(w)
}

// parseWorkspaceList is parseWorkspace of a record as HGETALL's flat list
// of fields and values, which a script answers: decoded as it stands,
// with no map built on the way.
func parseWorkspaceList(xs []any) (sandgate.Workspace, error) {
	var w sandgate.Workspace
	for i := 0; i+1 < len(xs); i += 2 {
		k, _ := xs[i].(string)
		v, _ := xs[i+1].(string)
		setWorkspaceField(&w, k, v)
	}
	return checkParsed(w)
}

func checkParsed(w sandgate.Workspace) (sandgate.Workspace, error) {
	if w.ID == "" || w.State == "" {
		return sandgate.Workspace{}, fmt.Errorf("store: workspace record without id or state")
	}
	return w, nil
}

// setWorkspaceField sets the field of w that record field k holds, v its
// value (a number that does not parse reads as 0, as a missing one);
// fields it does not know are left alone.
func setWorkspaceField(w *sandgate.Workspace, k, v string) {
	num := func() int64 {
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	switch k {
	case "id":
		w.ID = v
	case "account":
		w.AccountID = v
	case "instance":
		w.InstanceID = v
	case "label":
		w.Label = v
	case "size":
		w.Size = v
	case "image":
		w.Image = v
	case "agent":
		w.Agent = v
	case "run_id":
		w.RunID = v
	case "state":
		w.State = sandgate.WorkspaceState(v)
	case "provider":
		w.Provider = v
	case "provider_ref":
		w.ProviderRef = v
	case "created_ms":
		w.CreatedAt = fromMS(num())
	case "started_ms":
		w.StartedAt = fromMS(num())
	case "expires_ms":
		w.ExpiresAt = fromMS(num())
	case "idle_ms":
		w.IdleTimeout = time.Duration(num()) * time.Millisecond
	case "activity_ms":
		w.LastActivity = fromMS(num())
	case "busy_ms":
		w.BusyUntil = fromMS(num())
	case "terminated_ms":
		w.TerminatedAt = fromMS(num())
	case "reason":
		w.TerminationReason = sandgate.TerminationReason(v)
	case "rate_card":
		w.Price.RateCard = v
	case "rate_card_version":
		w.Price.RateCardVersion = int(num())
	case "currency":
		w.Price.Currency = v
	case "price_micros":
		w.Price.UnitMicros = num()
	case "hold_micros":
		w.Price.HoldMicros = num()
	case "egress_out":
		w.EgressBytesOut = num()
	case "egress_in":
		w.EgressBytesIn = num()
	case "allowed_domains":
		w.Domains = v
	}
}

// LiveWorkspaces returns every workspace not yet terminated in a scope:
// one instance (acct and inst set), one account (inst empty), or every
// account (both empty), each instance's in creation order. It reads the
// live indexes (instanceLive), so a workspace whose slot was pruned past
// its deadline is still found, and a terminated one costs nothing.
func (db *DB) LiveWorkspaces(ctx context.Context, acct, inst string, now time.Time) ([]sandgate.Workspace, error) {
	return db.walkWorkspaces(ctx, acct, inst, true, now)
}

// walkWorkspaces lists the workspaces of a scope (see LiveWorkspaces), live
// ones only or every one within retention, each instance's in creation
// order, a page of ListWorkspaces at a time.
func (db *DB) walkWorkspaces(ctx context.Context, acct, inst string, liveOnly bool, now time.Time) ([]sandgate.Workspace, error) {
	type pair struct{ acct, inst string }
	var scopes []pair
	switch {
	case acct != "" && inst != "":
		scopes = []pair{{acct, inst}}
	default:
		accts := []string{acct}
		if acct == "" {
			as, err := db.Accounts(ctx)
			if err != nil {
				return nil, err
			}
			accts = accts[:0]
			for _, a := range as {
				accts = append(accts, a.ID)
			}
		}
		for _, a := range accts {
			ids, err := db.rdb.SMembers(ctx, instancesKey(a)).Result()
			if err != nil {
				return nil, err
			}
			for _, i := range ids {
				scopes = append(scopes, pair{a, i})
			}
		}
	}
	var out []sandgate.Workspace
	for _, sc := range scopes {
		if liveOnly {
			ws, err := db.instanceLive(ctx, sc.acct, sc.inst, now)
			if err != nil {
				return nil, err
			}
			out = append(out, ws...)
			continue
		}
		for cursor := ""; ; {
			ws, next, err := db.ListWorkspaces(ctx, sc.acct, sc.inst, cursor, 100, liveOnly, now)
			if err != nil {
				return nil, err
			}
			out = append(out, ws...)
			if next == "" {
				break
			}
			cursor = next
		}
	}
	return out, nil
}
