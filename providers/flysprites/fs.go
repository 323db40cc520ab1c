package flysprites

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"

	"github.com/sandgate/sandgate/providers"
)

// The fs API of sheet §6. Paths are absolute and workingDir is "/" on every
// call, as sprites-go sends it.

type fsEntry struct {
	Name  string `json:"name"`
	Path  string `json:"path"`
	Type  string `json:"type"` // "file" | "directory"
	Size  int64  `json:"size"`
	Mode  string `json:"mode"` // octal text
	IsDir bool   `json:"isDir"`
}

type fsListing struct {
	Path    string    `json:"path"`
	Entries []fsEntry `json:"entries"`
	Count   int       `json:"count"`
}

func fsQuery(p string) url.Values { return url.Values{"path": {p}, "workingDir": {"/"}} }

func (c *client) fsList(ctx context.Context, name, p string) (fsListing, error) {
	var l fsListing
	err := c.call(ctx, request{op: "fs list", method: http.MethodGet, path: spritePath(name, "/fs/list"),
		query: fsQuery(p), accept: []int{http.StatusOK}}, &l)
	return l, err
}

// fsRead opens the file's content; the caller closes the body.
func (c *client) fsRead(ctx context.Context, name, p string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, request{op: "fs read", method: http.MethodGet, path: spritePath(name, "/fs/read"),
		query: fsQuery(p), accept: []int{http.StatusOK, http.StatusPartialContent}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// fsWrite replaces the file, creating parents. The docs call the parents
// flag mkdir and sprites-go mkdirParents (sheet §6, UNCERTAIN): both are sent.
func (c *client) fsWrite(ctx context.Context, name, p string, mode string, data []byte) error {
	q := fsQuery(p)
	q.Set("mode", mode)
	q.Set("mkdirParents", "true")
	q.Set("mkdir", "true")
	if data == nil {
		data = []byte{}
	}
	return c.call(ctx, request{op: "fs write", method: http.MethodPut, path: spritePath(name, "/fs/write"),
		query: q, raw: data, accept: []int{http.StatusOK, http.StatusCreated}}, nil)
}

// kind is what stat found at a path.
type kind int

const (
	kindNone kind = iota
	kindFile
	kindDir
	kindBlocked // nothing there, and a parent is a file: nothing can be
)

// stat finds what is at p. sprites-go stats a file by listing its path and
// taking the first entry (sheet §6); listing a directory lists its
// children instead, so a path is a file only when the listing holds
// exactly that path as a file.
func (p *Provider) stat(ctx context.Context, name, file string) (kind, fsEntry, error) {
	l, err := p.c.fsList(ctx, name, file)
	switch s := statusOf(err); {
	case s == http.StatusNotFound:
		return kindNone, fsEntry{}, p.goneOr(ctx, name, nil)
	case refusedPath(s):
		// The vendor's answer for a path below a file is not documented:
		// look for a parent that is a file.
		if gerr := p.goneOr(ctx, name, nil); gerr != nil {
			return kindNone, fsEntry{}, gerr
		}
		if p.parentIsFile(ctx, name, file) {
			return kindBlocked, fsEntry{}, nil
		}
		return kindNone, fsEntry{}, err
	case err != nil:
		return kindNone, fsEntry{}, err
	}
	if len(l.Entries) == 1 {
		e := l.Entries[0]
		if namesPath(e, file) && !e.isDir() {
			return kindFile, e, nil
		}
	}
	if len(l.Entries) == 0 && path.Dir(file) != file {
		// An empty directory, or, as sprites-go reads an empty listing
		// (sheet §6), nothing at all: the parent's listing tells which.
		return p.statInParent(ctx, name, file)
	}
	return kindDir, fsEntry{}, nil
}

// statInParent finds what is at file from its parent's listing: a
// directory or a file named so, or nothing (also when the parent itself
// is missing).
func (p *Provider) statInParent(ctx context.Context, name, file string) (kind, fsEntry, error) {
	l, err := p.c.fsList(ctx, name, path.Dir(file))
	switch s := statusOf(err); {
	case s == http.StatusNotFound || refusedPath(s):
		return kindNone, fsEntry{}, p.goneOr(ctx, name, nil)
	case err != nil:
		return kindNone, fsEntry{}, err
	}
	for _, e := range l.Entries {
		if !namesPath(e, file) {
			continue
		}
		if e.isDir() {
			return kindDir, fsEntry{}, nil
		}
		return kindFile, e, nil
	}
	return kindNone, fsEntry{}, nil
}

// refusedPath reports whether status s refuses the path itself (a 4xx
// other than 404, authentication, permission and rate limits), as the
// vendor's undocumented answer for a path below a file may.
func refusedPath(s int) bool {
	return s >= 400 && s < 500 && s != http.StatusNotFound && s != http.StatusUnauthorized &&
		s != http.StatusForbidden && s != http.StatusTooManyRequests
}

// namesPath reports whether a listing's entry is the one at file.
func namesPath(e fsEntry, file string) bool {
	return e.Path == file || (e.Path == "" && e.Name == path.Base(file))
}

// isDir reports whether the entry is a directory, by either field.
func (e fsEntry) isDir() bool { return e.IsDir || e.Type == "directory" }

// ReadFile implements providers.Provider through the fs API: a stat first,
// so that a directory or a file over max is refused without moving its
// content, then a read copied to w as it arrives, of at most max+1 bytes
// (a file that grew in between is refused too).
func (p *Provider) ReadFile(ctx context.Context, sb providers.Sandbox, file string, limit int64, w io.Writer) (int64, error) {
	if err := checkPath(file); err != nil {
		return 0, err
	}
	limit = max(0, limit)
	k, e, err := p.stat(ctx, sb.Ref, file)
	switch {
	case err != nil:
		return 0, fmt.Errorf("flysprites: read: %w", err)
	case k == kindNone || k == kindBlocked:
		return 0, fmt.Errorf("flysprites: read: %w", providers.ErrFileNotFound)
	case k == kindDir:
		return 0, fmt.Errorf("flysprites: read: %w", providers.ErrNotAFile)
	case e.Size > limit:
		return 0, fmt.Errorf("flysprites: read: %w", providers.ErrFileTooLarge)
	}
	body, err := p.c.fsRead(ctx, sb.Ref, file)
	if statusOf(err) == http.StatusNotFound {
		if err := p.goneOr(ctx, sb.Ref, nil); err != nil {
			return 0, fmt.Errorf("flysprites: read: %w", err)
		}
		return 0, fmt.Errorf("flysprites: read: %w", providers.ErrFileNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("flysprites: read: %w", err)
	}
	defer body.Close()
	n, err := io.Copy(w, io.LimitReader(body, limit+1))
	if err != nil {
		return n, fmt.Errorf("flysprites: read: %w", err)
	}
	if n > limit {
		return n, fmt.Errorf("flysprites: read: %w", providers.ErrFileTooLarge)
	}
	return n, nil
}

// WriteFile implements providers.Provider through the fs API. A path that
// is a directory is refused before the write; a write the vendor refuses
// is refused as ErrNotAFile when a parent turns out to be a file. A file
// that exists keeps its mode; a new one is 0644. r is read to its end
// before anything is sent, so a failing r sends nothing: the fs API
// replaces the file with one request body, which must be whole.
func (p *Provider) WriteFile(ctx context.Context, sb providers.Sandbox, file string, r io.Reader) error {
	if err := checkPath(file); err != nil {
		return err
	}
	data, err := providers.ReadContent(r)
	if err != nil {
		return fmt.Errorf("flysprites: write: %w", err)
	}
	if file == "/" || file[len(file)-1] == '/' {
		return fmt.Errorf("flysprites: write: %w", providers.ErrNotAFile)
	}
	k, e, err := p.stat(ctx, sb.Ref, file)
	switch {
	case err != nil:
		return fmt.Errorf("flysprites: write: %w", err)
	case k == kindDir || k == kindBlocked:
		return fmt.Errorf("flysprites: write: %w", providers.ErrNotAFile)
	}
	mode := "0644"
	if k == kindFile {
		if m, err := strconv.ParseUint(e.Mode, 8, 32); err == nil {
			mode = fmt.Sprintf("%04o", m&0o7777)
		}
	}
	err = p.c.fsWrite(ctx, sb.Ref, file, mode, data)
	if err == nil {
		return nil
	}
	if s := statusOf(err); s >= 400 && s < 500 && s != http.StatusTooManyRequests {
		if err := p.goneOr(ctx, sb.Ref, nil); err != nil {
			return fmt.Errorf("flysprites: write: %w", err)
		}
		if p.parentIsFile(ctx, sb.Ref, file) {
			return fmt.Errorf("flysprites: write: %w", providers.ErrNotAFile)
		}
	}
	return fmt.Errorf("flysprites: write: %w", err)
}

// parentIsFile reports whether a parent of file is a file, walking up
// from the nearest parent until one exists.
func (p *Provider) parentIsFile(ctx context.Context, name, file string) bool {
	for d := path.Dir(file); d != "/"; d = path.Dir(d) {
		l, err := p.c.fsList(ctx, name, d)
		if statusOf(err) == http.StatusNotFound || (err != nil && statusOf(err) >= 400 && statusOf(err) < 500) {
			continue
		}
		if err != nil {
			return false
		}
		if len(l.Entries) == 0 {
			continue // an empty directory, or nothing (sheet §6): its parents tell
		}
		return len(l.Entries) == 1 && l.Entries[0].Path == d && !l.Entries[0].isDir()
	}
	return false
}

// goneOr returns ErrSandboxGone when the sprite no longer exists, else
// otherwise (an error GET itself fails with is returned as is).
func (p *Provider) goneOr(ctx context.Context, name string, otherwise error) error {
	_, err := p.c.get(ctx, name)
	switch {
	case statusOf(err) == http.StatusNotFound:
		return fmt.Errorf("flysprites: %w", providers.ErrSandboxGone)
	case err != nil:
		return err
	}
	return otherwise
}

var errBadPath = errors.New("flysprites: path must be absolute and free of NUL")

func checkPath(p string) error {
	if len(p) == 0 || p[0] != '/' {
		return errBadPath
	}
	for i := 0; i < len(p); i++ {
		if p[i] == 0 {
			return errBadPath
		}
	}
	return nil
}
