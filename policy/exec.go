package policy

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sandgate/sandgate/protocol"
)

// Limits of exec and file requests (spec §Exec, §ReadFile).
const (
	MaxArgs      = 4096
	MaxArgvBytes = 256 << 10
	MaxPathBytes = 4096
)

// ValidatePath checks the path of a file request: absolute, at most
// [MaxPathBytes] bytes, no NUL. Returns InvalidRequest naming the field
// "path", never the value.
func ValidatePath(p string) error { return ValidatePathField("path", p) }

// ValidatePathField is [ValidatePath] for a field with another name, such as
// "dir" of an exec or a snapshot; an optional field is checked only when it
// is set. field must be a constant of the caller, never request content.
// The path need not be clean: the sandbox confines it, not the grammar.
func ValidatePathField(field, p string) error {
	switch {
	case p == "":
		return invalid(field + " is required: an absolute path")
	case len(p) > MaxPathBytes:
		return invalid(fmt.Sprintf("%s is longer than %d bytes", field, MaxPathBytes))
	case strings.IndexByte(p, 0) >= 0:
		return invalid(field + " must not contain a NUL byte")
	case p[0] != '/':
		return invalid(field + " must be an absolute path (starting with /)")
	}
	return nil
}

// ValidateArgv checks the argv of an exec or a durable command: 1 to
// [MaxArgs] strings, at most [MaxArgvBytes] bytes in all, no NUL in any of
// them (a NUL would cut the argument short at execve), and a non-empty
// argv[0], since there is no program to run otherwise. Returns
// InvalidRequest naming the rule and an index, never an argument.
func ValidateArgv(argv []string) error {
	switch {
	case len(argv) == 0:
		return invalid("argv is required: the program and its arguments, run without a shell")
	case len(argv) > MaxArgs:
		return invalid(fmt.Sprintf("argv has %d strings; the limit is %d", len(argv), MaxArgs))
	case argv[0] == "":
		return invalid("argv[0] must name the program to run")
	}
	total := 0
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return invalid(fmt.Sprintf("argv[%d] contains a NUL byte", i))
		}
		total += len(a)
	}
	if total > MaxArgvBytes {
		return invalid(fmt.Sprintf("argv totals %d bytes; the limit is %d (256 KiB)", total, MaxArgvBytes))
	}
	return nil
}

// ClampExecTimeout returns the timeout of one exec and whether it was
// clamped (spec §Exec, timeout_seconds). A requested 0 means def. The result
// is at most maxTimeout and at most untilExpiry, the time left before the
// workspace's expires_at; clamped reports that it is shorter than the
// timeout asked for, whether explicitly or by default.
//
// def and maxTimeout are the scope's exec timeouts after Limits.WithDefaults.
// Returns InvalidRequest for a negative request, WorkspaceGone when
// untilExpiry is not positive, and a plain error (internal) when def or
// maxTimeout is not positive.
func ClampExecTimeout(requested, def, maxTimeout, untilExpiry time.Duration) (d time.Duration, clamped bool, err error) {
	switch {
	case requested < 0:
		return 0, false, invalid("timeout_seconds must not be negative; 0 or omitted means default_exec_timeout_seconds")
	case def <= 0 || maxTimeout <= 0:
		return 0, false, errors.New("policy: exec timeout limits must be positive")
	case untilExpiry <= 0:
		return 0, false, protocol.E(protocol.WorkspaceGone, "the workspace reached its expires_at; acquire a new workspace")
	}
	d = requested
	if d == 0 {
		d = def
	}
	if d > maxTimeout {
		d, clamped = maxTimeout, true
	}
	if d > untilExpiry {
		d, clamped = untilExpiry, true
	}
	return d, clamped, nil
}

// Seconds converts a wire "_seconds" value to a Duration, saturating instead
// of overflowing, so that a huge timeout_seconds is clamped rather than
// wrapped into a small or negative one.
func Seconds(n int64) time.Duration {
	const limit = math.MaxInt64 / int64(time.Second)
	switch {
	case n > limit:
		return math.MaxInt64
	case n < -limit:
		return math.MinInt64
	}
	return time.Duration(n) * time.Second
}
