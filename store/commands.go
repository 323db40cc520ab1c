package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
)

// commandTTLPast is how long a command's record outlives its workspace's
// expires_at; after that every read answers 410 workspace_gone anyway.
const commandTTLPast = 24 * time.Hour

// CommandClaimed is returned by ClaimCommand when the identity was claimed
// (or fenced by a cancel) before: nothing new is launched.
type CommandClaimed struct{ State sandgate.CommandState }

func (c *CommandClaimed) Error() string { return "store: command identity already claimed" }

func (db *DB) commandKeys(w sandgate.Workspace, key string) []string {
	return []string{commandKey(w.AccountID, w.ID, key), workspaceKey(w.AccountID, w.ID), busyKey(w.AccountID, w.ID)}
}

// ClaimCommand claims the identity key (the hex SHA-256 of the client's
// identity) of a running workspace, atomically across every gateway
// process. The command must be launched by dispatchBy, and is killed at
// deadline. Returns a *CommandClaimed when the identity was claimed or
// fenced before, ErrStateChanged when the workspace is not running.
func (db *DB) ClaimCommand(ctx context.Context, w sandgate.Workspace, key string, now, dispatchBy, deadline time.Time) error {
	return db.claimCommand(ctx, w, key, now, dispatchBy, deadline, sandgate.NewID("claim_"))
}

// claimCommand is ClaimCommand with the claim's nonce: a script run twice
// with one nonce (a command resent) claims once and answers both runs.
func (db *DB) claimCommand(ctx context.Context, w sandgate.Workspace, key string, now, dispatchBy, deadline time.Time, nonce string) error {
	res, err := claimCommandScript.Run(ctx, db.rdb, db.commandKeys(w, key), ms(now), ms(dispatchBy), ms(deadline),
		key, w.ID, ms(w.ExpiresAt.Add(commandTTLPast)), nonce).Slice()
	if err != nil {
		return fmt.Errorf("claim command: %w", err)
	}
	switch code, _ := res[0].(int64); code {
	case resOK:
		return nil
	case resReplay:
		st, _ := res[1].(string)
		return &CommandClaimed{State: sandgate.CommandState(st)}
	case resGone:
		return ErrStateChanged
	}
	return fmt.Errorf("claim command: unexpected result %v", res)
}

// CommandLaunched records a launch the provider confirmed and returns the
// command's state after it: running, or canceled when a cancel came first.
func (db *DB) CommandLaunched(ctx context.Context, w sandgate.Workspace, key string) (sandgate.CommandState, error) {
	st, err := launchedCommandScript.Run(ctx, db.rdb, []string{commandKey(w.AccountID, w.ID, key)}).Text()
	if err != nil {
		return "", fmt.Errorf("command launched: %w", err)
	}
	return sandgate.CommandState(st), nil
}

// UnclaimCommand releases the identity of a command that definitely did
// not start. A record canceled meanwhile stays, as the fence.
func (db *DB) UnclaimCommand(ctx context.Context, w sandgate.Workspace, key string) error {
	if err := unclaimCommandScript.Run(ctx, db.rdb, db.commandKeys(w, key), key).Err(); err != nil {
		return fmt.Errorf("unclaim command: %w", err)
	}
	return nil
}

// CancelOutcome is what CancelCommand found.
type CancelOutcome int

// Cancel outcomes.
const (
	// CancelFenced: the identity was never claimed; it is now fenced and
	// can never launch.
	CancelFenced CancelOutcome = iota
	// CancelFinished: the command already has its result, which stays.
	CancelFinished
	// CancelRecorded: a claimed command is now canceled; the provider must
	// fence or kill it.
	CancelRecorded
)

// CancelCommand records a cancel of identity key; see CancelOutcome.
func (db *DB) CancelCommand(ctx context.Context, w sandgate.Workspace, key string, now time.Time) (CancelOutcome, error) {
	res, err := cancelCommandScript.Run(ctx, db.rdb, db.commandKeys(w, key)[:2], ms(now),
		ms(w.ExpiresAt.Add(commandTTLPast)), key, w.ID).Slice()
	if err != nil {
		return 0, fmt.Errorf("cancel command: %w", err)
	}
	switch code, _ := res[0].(int64); code {
	case resAbsent:
		return CancelFenced, nil
	case resFinished:
		return CancelFinished, nil
	case resOK:
		return CancelRecorded, nil
	}
	return 0, fmt.Errorf("cancel command: unexpected result %v", res)
}

// FinishCommand records a finished command's state (completed or
// canceled) and exit status, unless it has one already, and returns the
// state after the call. exitCode < 0 records none.
func (db *DB) FinishCommand(ctx context.Context, w sandgate.Workspace, key string, state sandgate.CommandState, exitCode int, timedOut bool, now time.Time) (sandgate.CommandState, error) {
	code := ""
	if exitCode >= 0 {
		code = strconv.Itoa(exitCode)
	}
	to := "0"
	if timedOut {
		to = "1"
	}
	st, err := finishCommandScript.Run(ctx, db.rdb, db.commandKeys(w, key), string(state), code, to, ms(now), key).Text()
	if err != nil {
		return "", fmt.Errorf("finish command: %w", err)
	}
	return sandgate.CommandState(st), nil
}

// BusyCommands returns the keys of the workspace's durable commands that
// keep it busy: claimed, and not yet seen finished. Execs in flight, which
// also keep it busy, are not commands and are left out.
func (db *DB) BusyCommands(ctx context.Context, w sandgate.Workspace) ([]string, error) {
	members, err := db.rdb.ZRange(ctx, busyKey(w.AccountID, w.ID), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	keys := members[:0]
	for _, m := range members {
		if !strings.HasPrefix(m, execBusyPrefix) {
			keys = append(keys, m)
		}
	}
	return keys, nil
}

// Command returns a workspace's durable command by identity key. Returns ErrNotFound.
func (db *DB) Command(ctx context.Context, w sandgate.Workspace, key string) (sandgate.Command, error) {
	m, err := db.rdb.HGetAll(ctx, commandKey(w.AccountID, w.ID, key)).Result()
	if err != nil {
		return sandgate.Command{}, err
	}
	if len(m) == 0 {
		return sandgate.Command{}, ErrNotFound
	}
	num := func(k string) int64 {
		v, _ := strconv.ParseInt(m[k], 10, 64)
		return v
	}
	return sandgate.Command{
		WorkspaceID: m["ws"],
		Key:         m["key"],
		State:       sandgate.CommandState(m["state"]),
		Launched:    m["launched"] == "1",
		Canceled:    m["canceled"] == "1",
		ExitCode:    int(num("exit_code")),
		HasExit:     m["has_exit"] == "1",
		TimedOut:    m["timed_out"] == "1",
		ClaimedAt:   fromMS(num("claimed_ms")),
		DispatchBy:  fromMS(num("dispatch_ms")),
		Deadline:    fromMS(num("deadline_ms")),
		FinishedAt:  fromMS(num("finished_ms")),
	}, nil
}
