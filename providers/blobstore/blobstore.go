// Package blobstore keeps snapshot archives outside every sandbox, for the
// providers whose vendor cannot store a directory and restore it into a
// new sandbox (Fly Machines, Fly Sprites). A blob is named by the broker's
// snapshot id and written whole or not at all.
package blobstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// ErrNotFound is returned for a blob that does not exist.
var ErrNotFound = errors.New("blobstore: no such blob")

// ErrTooLarge is returned by Put when the blob is over its limit; nothing
// is stored.
var ErrTooLarge = errors.New("blobstore: blob over its size limit")

// Store keeps blobs by id. Implementations are safe for concurrent use and
// shared by every broker process that shares their backing storage.
type Store interface {
	// Put stores what r yields under id, at most max bytes (0: no limit),
	// and returns the size. A reader never sees a partial blob: a Put that
	// fails leaves the previous blob of id, or none. Returns ErrTooLarge.
	Put(ctx context.Context, id string, r io.Reader, max int64) (int64, error)
	// Open returns the blob and its size. Returns ErrNotFound.
	Open(ctx context.Context, id string) (io.ReadCloser, int64, error)
	// Delete removes the blob. Deleting a blob that does not exist succeeds.
	Delete(ctx context.Context, id string) error
}

// Dir is a Store in a directory of the broker's host: one file per blob.
// Brokers that share the directory (one data_dir) share the blobs.
type Dir struct {
	root string
}

// NewDir returns a Dir over root, creating it (mode 0700).
func NewDir(root string) (*Dir, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("blobstore: %w", err)
	}
	return &Dir{root: root}, nil
}

// checkID refuses an id that is not one safe file name.
func checkID(id string) error {
	if id == "" || len(id) > 128 || id[0] == '.' || strings.ContainsAny(id, "/\\\x00") {
		return errors.New("blobstore: blob id is not a safe file name")
	}
	return nil
}

func (d *Dir) path(id string) string { return filepath.Join(d.root, id+".blob") }

// Put implements Store: the blob is written to a temporary file beside its
// place, synced, and renamed over it.
func (d *Dir) Put(ctx context.Context, id string, r io.Reader, max int64) (int64, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	f, err := os.CreateTemp(d.root, ".put-*")
	if err != nil {
		return 0, fmt.Errorf("blobstore: %w", err)
	}
	tmp := f.Name()
	fail := func(err error) (int64, error) {
		f.Close()
		os.Remove(tmp)
		return 0, err
	}
	src := r
	if max > 0 {
		src = io.LimitReader(r, max+1)
	}
	n, err := io.Copy(f, readerCtx{ctx, src})
	switch {
	case err != nil:
		return fail(fmt.Errorf("blobstore: write: %w", err))
	case max > 0 && n > max:
		return fail(ErrTooLarge)
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("blobstore: sync: %w", err))
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return 0, fmt.Errorf("blobstore: %w", err)
	}
	if err := os.Rename(tmp, d.path(id)); err != nil {
		os.Remove(tmp)
		return 0, fmt.Errorf("blobstore: %w", err)
	}
	return n, nil
}

// Open implements Store.
func (d *Dir) Open(_ context.Context, id string) (io.ReadCloser, int64, error) {
	if err := checkID(id); err != nil {
		return nil, 0, err
	}
	f, err := os.Open(d.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("blobstore: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("blobstore: %w", err)
	}
	return f, st.Size(), nil
}

// Delete implements Store.
func (d *Dir) Delete(_ context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := os.Remove(d.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("blobstore: %w", err)
	}
	return nil
}

// readerCtx stops a copy when its context ends.
type readerCtx struct {
	ctx context.Context
	r   io.Reader
}

func (r readerCtx) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

// Interface guards
var _ Store = (*Dir)(nil)
