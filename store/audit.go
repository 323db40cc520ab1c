package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// AuditEvent is one entry of the operator audit log: an operator action or
// a refused operator request. It never holds a token: Actor names the
// operator token by its configured name and prefix only.
type AuditEvent struct {
	Time      time.Time       `json:"time"`
	Actor     string          `json:"actor"`          // "name:prefix", the name alone, or "unknown" (401)
	Role      string          `json:"role,omitempty"` // the operator token's role; empty when unauthenticated
	Action    string          `json:"action"`         // for example stop.on, pause, limits.set, token.revoke
	Target    string          `json:"target,omitempty"`
	Outcome   AuditOutcome    `json:"outcome"`
	SourceIP  string          `json:"source_ip"`
	UserAgent string          `json:"user_agent"`
	RequestID string          `json:"request_id"`
	Before    json.RawMessage `json:"before"` // the changed object before the action; null when none
	After     json.RawMessage `json:"after"`  // and after it
}

// AuditOutcome is how an audited request ended.
type AuditOutcome struct {
	Status int    `json:"status"`         // the HTTP status answered
	Code   string `json:"code,omitempty"` // the error code of a refusal
	// Terminated and Failed count the workspaces the action ended, or
	// failed to end, when it ended any (stop, pause, revoke).
	Terminated *int `json:"terminated,omitempty"`
	Failed     *int `json:"failed,omitempty"`
}

// AppendAudit appends e to the audit log and trims entries older than
// retention (approximately: whole stream nodes go at once, so entries are
// kept at least that long). The entry's id is e.Time's unix ms, or the
// newest entry's when a gateway's clock is behind, so ids stay ordered.
func (db *DB) AppendAudit(ctx context.Context, e AuditEvent, retention time.Duration) error {
	return db.appendAudit(ctx, e, "", retention)
}

// AppendAuditOnce is AppendAudit for an event its writer may write again
// (it cannot tell whether an earlier try landed): once names the event,
// and an event named once before, within retention, is not appended
// again. Budget alerts use it.
func (db *DB) AppendAuditOnce(ctx context.Context, e AuditEvent, once string, retention time.Duration) error {
	if once == "" {
		return errors.New("append audit: an event written once needs a name")
	}
	return db.appendAudit(ctx, e, once, retention)
}

func (db *DB) appendAudit(ctx context.Context, e AuditEvent, once string, retention time.Duration) error {
	minID := max(ms(e.Time)-retention.Milliseconds(), 0)
	keys, args := []string{auditKey()}, []any{ms(e.Time), minID, mustJSON(e)}
	if once != "" {
		keys, args = append(keys, auditOnceKey()), append(args, once)
	}
	if err := auditScript.Run(ctx, db.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("append audit: %w", err)
	}
	return nil
}

// AuditRange calls fn with each audit entry whose id time is in
// [from, to), oldest first, as the JSON of an AuditEvent. A zero from means
// the oldest entry, a zero to the newest. It reads page entries at a time
// (0 means 500), so memory stays constant however long the range is. It
// stops at fn's first error and returns it.
func (db *DB) AuditRange(ctx context.Context, from, to time.Time, page int, fn func(event []byte) error) error {
	if page <= 0 {
		page = 500
	}
	start, end := "-", "+"
	if !from.IsZero() {
		start = strconv.FormatInt(ms(from), 10) + "-0"
	}
	if !to.IsZero() {
		end = "(" + strconv.FormatInt(ms(to), 10) + "-0"
	}
	for {
		msgs, err := db.rdb.XRangeN(ctx, auditKey(), start, end, int64(page)).Result()
		if err != nil && !isNil(err) {
			return fmt.Errorf("read audit: %w", err)
		}
		for _, m := range msgs {
			v, _ := m.Values["e"].(string)
			if v == "" {
				continue
			}
			if err := fn([]byte(v)); err != nil {
				return err
			}
		}
		if len(msgs) < page {
			return nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}
