package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Control is an emergency stop or a pause, set by an operator.
type Control struct {
	Reason string `json:"reason"`         // details.reason: a short slug such as operator or payment
	Note   string `json:"note,omitempty"` // free text for operators; never sent to clients
	Actor  string `json:"actor"`          // the operator token's name and prefix
	Since  int64  `json:"since_ms"`       // unix ms
	Until  int64  `json:"until_ms"`       // unix ms; 0: until turned off
}

// ActiveAt reports whether the control is in force at now.
func (c *Control) ActiveAt(now time.Time) bool {
	return c != nil && (c.Until == 0 || now.UnixMilli() < c.Until)
}

// Control fields of an account's controls hash.
const (
	FieldStop  = "stop"
	FieldPause = "pause"
)

// InstancePauseField is the controls-hash field of an instance's pause.
func InstancePauseField(inst string) string { return "pause:" + inst }

// Controls is the stop and pause state that applies to one instance.
type Controls struct {
	GlobalStop    *Control
	AccountStop   *Control
	AccountPause  *Control
	InstancePause *Control
}

// ControlsFor reads the controls that apply to an instance in one round trip.
func (db *DB) ControlsFor(ctx context.Context, acct, inst string) (Controls, error) {
	pipe := db.rdb.Pipeline()
	read := queueControls(ctx, pipe, acct, inst)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Controls{}, err
	}
	return read()
}

// queueControls queues the reads of ControlsFor on a pipeline; the
// returned function decodes them once the pipeline ran.
func queueControls(ctx context.Context, pipe redis.Pipeliner, acct, inst string) func() (Controls, error) {
	g := pipe.Get(ctx, globalStopKey())
	h := pipe.HMGet(ctx, controlsKey(acct), FieldStop, FieldPause, InstancePauseField(inst))
	return func() (Controls, error) { return decodeControls(g, h) }
}

func decodeControls(g *redis.StringCmd, h *redis.SliceCmd) (Controls, error) {
	if err := h.Err(); err != nil {
		return Controls{}, err
	}
	var c Controls
	var err error
	if v, gerr := g.Result(); gerr == nil {
		c.GlobalStop, err = decodeControl(v)
		if err != nil {
			return Controls{}, err
		}
	}
	vals := h.Val()
	dst := []**Control{&c.AccountStop, &c.AccountPause, &c.InstancePause}
	for i, v := range vals {
		s, ok := v.(string)
		if !ok || s == "" {
			continue
		}
		if *dst[i], err = decodeControl(s); err != nil {
			return Controls{}, err
		}
	}
	return c, nil
}

func decodeControl(s string) (*Control, error) {
	var c Control
	if err := jsonUnmarshal([]byte(s), &c); err != nil {
		return nil, fmt.Errorf("store: control record: %w", err)
	}
	return &c, nil
}

// GlobalStop returns the broker-wide stop, or nil.
func (db *DB) GlobalStop(ctx context.Context) (*Control, error) {
	v, err := db.rdb.Get(ctx, globalStopKey()).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeControl(v)
}

// SetGlobalStop sets (c non-nil) or clears the broker-wide stop and tells
// every gateway at once.
func (db *DB) SetGlobalStop(ctx context.Context, c *Control) error {
	var err error
	if c == nil {
		err = db.rdb.Del(ctx, globalStopKey()).Err()
	} else {
		err = db.rdb.Set(ctx, globalStopKey(), mustJSON(c), 0).Err()
	}
	if err != nil {
		return fmt.Errorf("set global stop: %w", err)
	}
	return db.publishInvalidate(ctx)
}

// Control returns one field of an account's controls (FieldStop,
// FieldPause or InstancePauseField), or nil when it is not set.
func (db *DB) Control(ctx context.Context, acct, field string) (*Control, error) {
	v, err := db.rdb.HGet(ctx, controlsKey(acct), field).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeControl(v)
}

// SetControl sets (c non-nil) or clears one field of an account's
// controls (FieldStop, FieldPause or InstancePauseField) and tells every
// gateway at once.
func (db *DB) SetControl(ctx context.Context, acct, field string, c *Control) error {
	// The global listing set is another slot than the account's
	// controls, so on Redis Cluster it is a write of its own: first, so
	// that a control in force is always listed by status.
	var err error
	if c == nil {
		err = db.rdb.HDel(ctx, controlsKey(acct), field).Err()
	} else if err = db.rdb.SAdd(ctx, controlledKey(), acct).Err(); err == nil {
		err = db.rdb.HSet(ctx, controlsKey(acct), field, mustJSON(c)).Err()
	}
	if err != nil {
		return fmt.Errorf("set control: %w", err)
	}
	return db.publishInvalidate(ctx)
}

// AccountControl is one control of an account, for status listings.
type AccountControl struct {
	AccountID  string
	InstanceID string // empty for an account-wide control
	Kind       string // FieldStop or FieldPause
	Control    Control
}

// AllControls lists every account stop and pause that is set.
func (db *DB) AllControls(ctx context.Context) ([]AccountControl, error) {
	accts, err := db.rdb.SMembers(ctx, controlledKey()).Result()
	if err != nil {
		return nil, err
	}
	var out []AccountControl
	for _, a := range accts {
		m, err := db.rdb.HGetAll(ctx, controlsKey(a)).Result()
		if err != nil {
			return nil, err
		}
		for field, v := range m {
			c, err := decodeControl(v)
			if err != nil {
				return nil, err
			}
			ac := AccountControl{AccountID: a, Kind: field, Control: *c}
			if inst, ok := strings.CutPrefix(field, "pause:"); ok {
				ac.Kind, ac.InstanceID = FieldPause, inst
			}
			out = append(out, ac)
		}
	}
	return out, nil
}

// RiskLimits are an account's risk limits as an operator set them; a zero
// field means the broker's default.
type RiskLimits struct {
	AcquiresPerMinute int    `redis:"velocity"`
	MaxOpenWorkspaces int    `redis:"open"`
	MaxSize           string `redis:"max_size"`
}

// SetRiskLimits stores an account's risk limits.
func (db *DB) SetRiskLimits(ctx context.Context, acct string, l RiskLimits) error {
	return db.rdb.HSet(ctx, riskKey(acct), "velocity", l.AcquiresPerMinute, "open", l.MaxOpenWorkspaces, "max_size", l.MaxSize).Err()
}

// Risk returns an account's risk limits (zero fields where unset).
func (db *DB) Risk(ctx context.Context, acct string) (RiskLimits, error) {
	var l RiskLimits
	err := db.rdb.HGetAll(ctx, riskKey(acct)).Scan(&l)
	return l, err
}

// DecodeIdemRecord decodes an idempotency record read by a script.
func DecodeIdemRecord(s string, r *IdemRecord) error { return jsonUnmarshal([]byte(s), r) }

// EncodeIdemRecord encodes an idempotency record for a script to write.
func EncodeIdemRecord(r IdemRecord) string { return mustJSON(r) }
