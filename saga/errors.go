package saga

import (
	"context"
	"errors"
	"log/slog"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
)

// op is the kind of provider call a failure came from: it picks the
// message (and for some errors the code) the client gets.
type op int

const (
	opSandbox  op = iota // exec, files, durable commands
	opSnapshot           // a workspace's snapshot
	opRestore            // a snapshot restored into a new workspace
)

// refusal is one row of providerErrors.
type refusal struct {
	err    error // the provider's sentinel
	code   protocol.Code
	reason string // details.reason, where the spec defines one
	msg    string
}

var gone = refusal{providers.ErrSandboxGone, protocol.WorkspaceGone, "", "the workspace's sandbox has ended; acquire a new one"}

// providerErrors is the one table from provider errors to protocol
// errors, by op: the first row whose sentinel is in the chain answers,
// and an error no row matches is 502 upstream_error with fallback's
// message (never the vendor's text).
var providerErrors = [...][]refusal{
	opSandbox: {
		gone,
		{providers.ErrFileNotFound, protocol.FileNotFound, "", "no file at this path in the workspace"},
		{providers.ErrNotAFile, protocol.NotAFile, "", "the path is not a regular file"},
		// A deterministic mistake of the client's, not a provider failure:
		// 422 is in the spec's list for files/write and is not retried.
		{providers.ErrNotWritable, protocol.NotAFile, "not_writable", "the path cannot be written in the workspace (a read-only or system location)"},
		{providers.ErrFileTooLarge, protocol.FileTooLarge, "", "the file is over max_file_bytes"},
	},
	// The directory's problems are the client's (404, 422), the rest 410
	// or 502.
	opSnapshot: {
		{providers.ErrSnapshotTooLarge, protocol.SnapshotQuotaExceeded, "", "the snapshot would take the instance's live snapshots past max_snapshot_bytes; delete some first"},
		// The provider's own bound on one snapshot (execsnap's archive):
		// as deterministic as the quota, so never a retryable 502.
		{providers.ErrFileTooLarge, protocol.SnapshotQuotaExceeded, "", "the directory is larger than this broker's provider stores in one snapshot; snapshot a smaller directory"},
		{providers.ErrFileNotFound, protocol.FileNotFound, "", "dir does not exist in the workspace"},
		{providers.ErrNotAFile, protocol.NotAFile, "", "dir is not a directory that can be snapshotted (it must persist in the workspace)"},
		gone,
	},
	opRestore: {
		{providers.ErrSnapshotGone, protocol.SnapshotGone, "", "the snapshot's contents are gone; start cold"},
	},
}

// fallback is each op's message for a failure no row of providerErrors
// matches.
var fallback = [...]string{
	opSandbox:  "the sandbox provider failed; the outcome is unknown",
	opSnapshot: "the sandbox provider could not store the snapshot; retry with the same Idempotency-Key",
	opRestore:  "the sandbox provider could not restore the snapshot; the workspace was terminated; retry with the same Idempotency-Key",
}

// providerError maps a failure of a provider call of kind o to the
// protocol (providerErrors).
func providerError(o op, err error) error {
	for _, r := range providerErrors[o] {
		if errors.Is(err, r.err) {
			return &protocol.Error{Code: r.code, Reason: r.reason, Message: r.msg, Err: err}
		}
	}
	return &protocol.Error{Code: protocol.UpstreamError, Message: fallback[o], Err: err}
}

// ProviderError maps a failure of an exec, a file transfer or a durable
// command's read to the protocol: a sandbox that is gone is 410, a path's
// problems 404, 413 or 422, anything else 502 with a fixed message.
func ProviderError(err error) error { return providerError(opSandbox, err) }

// sandboxError maps a failure of a provider call of kind o on w's sandbox
// to the protocol (providerError). A sandbox the vendor no longer has
// ends w at once (termination.Terminator.Vanished): the workspace is
// terminated, its slot freed and its metering stopped now, instead of
// staying running until its idle timeout.
func (s *Saga) sandboxError(ctx context.Context, w sandgate.Workspace, o op, err error) error {
	if errors.Is(err, providers.ErrSandboxGone) {
		if _, verr := s.term.Vanished(ctx, w, s.clock.Now()); verr != nil {
			s.log.Error("end a workspace whose sandbox is gone; the reaper retries", sandgate.WorkspaceAttr(w.ID), slog.Any(sandgate.KeyError, verr))
		}
	}
	return providerError(o, err)
}
