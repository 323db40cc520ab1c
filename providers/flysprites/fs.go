package flysprites

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/execfile"
)

// The fs API of sheet §6. Paths are absolute and workingDir is "/" on every
// call, as sprites-go sends it.

func fsQuery(p string) url.Values { return url.Values{"path": {p}, "workingDir": {"/"}} }

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

// ReadFile reads a file as the tenant sees it, in a fresh jail; see
// [execfile.ReadFile]. Not through the fs API: it runs outside every jail,
// and whether it follows a tenant's symlinks (into the agent's directory,
// say) is not documented (sheet §6).
func (p *Provider) ReadFile(ctx context.Context, sb providers.Sandbox, file string, limit int64, w io.Writer) (int64, error) {
	return execfile.ReadFile(ctx, jailExecer{p}, sb, file, limit, w)
}

// WriteFile writes a file as the tenant would, in a fresh jail; see
// [execfile.WriteFile] and, for why not through the fs API, ReadFile.
func (p *Provider) WriteFile(ctx context.Context, sb providers.Sandbox, file string, r io.Reader) error {
	return execfile.WriteFile(ctx, jailExecer{p}, sb, file, r)
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
