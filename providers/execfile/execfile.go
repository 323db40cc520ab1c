// Package execfile reads and writes files in a sandbox through the
// provider's own Exec, so that every provider gets file transfer with the
// same semantics and any provider may later replace it with a native call.
//
// The work is done by small POSIX sh scripts run inside the sandbox. A path
// is always passed as an argument ("sh -c SCRIPT sh PATH"), never spliced
// into a script, and it is resolved inside the sandbox: a symlink can only
// lead to another file of the same sandbox, never to one of the host.
package execfile

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/providers"
)

// Execer runs one command in a sandbox; every [providers.Provider] is one.
type Execer interface {
	Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error)
}

// opTimeout bounds one file operation inside the sandbox. The scripts only
// refuse non-regular files (a FIFO could block), so this is a backstop for a
// wedged sandbox, not a limit a normal transfer gets near.
const opTimeout = 2 * time.Minute

// Exit codes of the scripts. They are spliced into the script sources below,
// so both sides share one definition; they avoid 1, 2, 126 and 127, which sh
// and the tools use for their own failures.
const (
	exitNotFound = 81
	exitNotAFile = 82
	exitTooLarge = 83
	exitReadOnly = 84
)

// readScript gets $1 = path, $2 = max bytes. It exits exitNotFound when the
// path does not exist (a dangling symlink included), exitNotAFile when it is
// not a regular file, and exitTooLarge when it is over $2 bytes; only then
// does it send the content, so an oversized file is never transferred.
var readScript = `p=$1
[ -e "$p" ] || exit ` + strconv.Itoa(exitNotFound) + `
[ -f "$p" ] || exit ` + strconv.Itoa(exitNotAFile) + `
n=$(wc -c <"$p") || exit 1
[ "$n" -le "$2" ] || exit ` + strconv.Itoa(exitTooLarge) + `
exec cat -- "$p"
`

// writeScript gets $1 = path and $2 = a random token for the temporary
// file's name, and the content on stdin. A final symlink is followed (like
// "echo >link"), so writing through it replaces its target. The content is
// written to a temporary file beside the target and renamed over it, so a
// reader sees the old or the new file, never a partial one. The new file is
// 0644, or 0755 when it replaces an executable file. It exits exitNotAFile
// when the path names a directory or a component of its parent is not one
// (a dangling symlink included),
// and exitReadOnly when the deepest directory that exists on the way to
// the path cannot be written (a read-only mount, or no write or search
// permission: test -w and -x ask the kernel, so they see both).
var writeScript = `p=$1
case $p in */) exit ` + strconv.Itoa(exitNotAFile) + `;; esac
if [ -L "$p" ]; then
	r=$(readlink -f -- "$p" 2>/dev/null) && [ -n "$r" ] && p=$r
fi
[ -d "$p" ] && exit ` + strconv.Itoa(exitNotAFile) + `
d=${p%/*}
[ -n "$d" ] || d=/
if ! mkdir -p -- "$d" 2>/dev/null; then
	a=$d
	while [ -n "$a" ]; do
		if { [ -e "$a" ] || [ -L "$a" ]; } && [ ! -d "$a" ]; then exit ` + strconv.Itoa(exitNotAFile) + `; fi
		a=${a%/*}
	done
	a=$d
	while [ -n "$a" ] && [ ! -d "$a" ]; do a=${a%/*}; done
	[ -n "$a" ] || a=/
	[ -w "$a" ] && [ -x "$a" ] || exit ` + strconv.Itoa(exitReadOnly) + `
	exit 1
fi
[ -w "$d" ] && [ -x "$d" ] || exit ` + strconv.Itoa(exitReadOnly) + `
t=$d/.sandgate-write-$2
set -C
cat >"$t" || { rm -f -- "$t"; exit 1; }
m=644
[ -f "$p" ] && [ -x "$p" ] && m=755
chmod "$m" "$t" && mv -f -- "$t" "$p" || { rm -f -- "$t"; exit 1; }
`

// ReadFile copies the content of the regular file at the absolute path in
// sb to w as the sandbox sends it, and returns the bytes written. Returns
// [providers.ErrFileNotFound] when it does not exist,
// [providers.ErrNotAFile] when it is a directory or another non-regular
// file, and [providers.ErrFileTooLarge] when it is over max bytes; in that
// last case the content never leaves the sandbox, unless the file grew
// after its size was checked (then at most max+1 bytes reach w). On an
// error, what reached w is not the file. Errors never carry the path.
func ReadFile(ctx context.Context, ex Execer, sb providers.Sandbox, path string, max int64, w io.Writer) (int64, error) {
	if err := checkPath(path); err != nil {
		return 0, err
	}
	max = clamp(max)
	cw := &countWriter{w: w}
	res, err := ex.Exec(ctx, sb, providers.ExecSpec{
		Argv:    []string{"sh", "-c", readScript, "sh", path, strconv.FormatInt(max, 10)},
		Timeout: opTimeout,
		// One byte over max lets us tell a file that grew after the size
		// check from one that is exactly max bytes.
		MaxOutputBytes: max + 1,
		Stdout:         cw,
	})
	if err != nil {
		return cw.n, fmt.Errorf("execfile: read: %w", err)
	}
	if cw.err != nil {
		return cw.n, fmt.Errorf("execfile: read: %w", cw.err)
	}
	if err := exitErr("read", res); err != nil {
		return cw.n, err
	}
	// The file may have grown between the size check and cat.
	if res.StdoutBytes > max {
		return cw.n, fmt.Errorf("execfile: read: %w", providers.ErrFileTooLarge)
	}
	if res.StdoutTruncated {
		// Within max yet cut: the provider lost the rest of the output.
		return cw.n, fmt.Errorf("execfile: read: %w", errIncomplete)
	}
	if res.Stdout != nil {
		// A provider may return the bytes instead of writing them to w.
		if _, err := cw.Write(res.Stdout); err != nil {
			return cw.n, fmt.Errorf("execfile: read: %w", err)
		}
	}
	if cw.n != res.StdoutBytes {
		return cw.n, fmt.Errorf("execfile: read: got %d of %d bytes", cw.n, res.StdoutBytes)
	}
	return cw.n, nil
}

// countWriter counts what it passes on, and keeps the first error of w
// (a provider's Exec does not report a failing Stdout).
type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}

// WriteFile creates the parent directories of the absolute path in sb and
// replaces the file there with what r yields. r is read to its end before
// anything runs in the sandbox, so a failing r (a request body cut short,
// invalid base64) leaves the file as it was; the script then writes a
// temporary file and renames it over the path. Returns
// [providers.ErrNotAFile] when the path is a directory or a parent is not a
// directory, and [providers.ErrNotWritable] when the sandbox cannot write
// there. Errors never carry the path.
func WriteFile(ctx context.Context, ex Execer, sb providers.Sandbox, path string, r io.Reader) error {
	if err := checkPath(path); err != nil {
		return err
	}
	data, err := providers.ReadContent(r)
	if err != nil {
		return fmt.Errorf("execfile: write: %w", err)
	}
	var tok [12]byte
	rand.Read(tok[:]) // never fails; see crypto/rand.Read
	res, err := ex.Exec(ctx, sb, providers.ExecSpec{
		Argv:    []string{"sh", "-c", writeScript, "sh", path, hex.EncodeToString(tok[:])},
		Stdin:   data,
		Timeout: opTimeout,
	})
	if err != nil {
		return fmt.Errorf("execfile: write: %w", err)
	}
	return exitErr("write", res)
}

// exitErr maps a script's exit to the provider errors. The script's stderr
// is not used: the shell's messages name the path.
func exitErr(op string, res providers.ExecResult) error {
	switch {
	case res.TimedOut:
		return fmt.Errorf("execfile: %s: timed out", op)
	case res.ExitCode == 0:
		return nil
	case res.ExitCode == exitNotFound:
		return fmt.Errorf("execfile: %s: %w", op, providers.ErrFileNotFound)
	case res.ExitCode == exitNotAFile:
		return fmt.Errorf("execfile: %s: %w", op, providers.ErrNotAFile)
	case res.ExitCode == exitTooLarge:
		return fmt.Errorf("execfile: %s: %w", op, providers.ErrFileTooLarge)
	case res.ExitCode == exitReadOnly:
		return fmt.Errorf("execfile: %s: %w", op, providers.ErrNotWritable)
	}
	return fmt.Errorf("execfile: %s: failed in the sandbox with exit code %d", op, res.ExitCode)
}

// errBadPath refuses a path that is not absolute or holds a NUL, which no
// sandbox could resolve; the gateway validates paths before they get here.
// errIncomplete: the provider reported the file's content cut short of
// its size, so what reached w is not the whole file.
var errIncomplete = errors.New("execfile: the provider lost part of the content on its way")

var errBadPath = fmt.Errorf("execfile: path must be absolute and free of NUL: %w", fs.ErrInvalid)

func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		return errBadPath
	}
	return nil
}

// clamp turns a negative max into zero, so that max+1 cannot overflow either.
func clamp(max int64) int64 {
	switch {
	case max < 0:
		return 0
	case max == 1<<63-1:
		return max - 1
	}
	return max
}
