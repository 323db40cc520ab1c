package admin_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
)

// fakeImages is an image store that knows every reference but those
// naming "missing", and holds "busy" in use.
type fakeImages struct {
	mu       sync.Mutex
	resolved []string
}

func (f *fakeImages) ResolveImages(ctx context.Context, kind string, refs []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range refs {
		if strings.Contains(r, "missing") {
			return errors.Join(admin.ErrImageNotFound, errors.New("image "+r+": not found"))
		}
		if r != "host" {
			f.resolved = append(f.resolved, r)
		}
	}
	return nil
}

func (f *fakeImages) Pull(ctx context.Context, ref string, progress func(string)) (adminapi.Image, error) {
	if strings.Contains(ref, "missing") {
		progress("resolving " + ref)
		return adminapi.Image{}, admin.ErrImageNotFound
	}
	progress("resolving " + ref)
	progress("layer sha256:aa: 10 bytes")
	return adminapi.Image{Ref: ref, Digest: "sha256:" + strings.Repeat("ab", 32), Size: 10, LastUsed: time.Unix(0, 0).UTC()}, nil
}

func (f *fakeImages) List() []adminapi.Image {
	return []adminapi.Image{{Ref: "reg.test/busy:1", Digest: "sha256:" + strings.Repeat("cd", 32), Size: 5, InUse: 1, LastUsed: time.Unix(0, 0).UTC()}}
}

func (f *fakeImages) Remove(ctx context.Context, ref string) error {
	switch {
	case strings.Contains(ref, "busy"):
		return admin.ErrImageInUse
	case strings.Contains(ref, "missing"):
		return admin.ErrImageNotFound
	}
	return nil
}

// TestImageRoutes: an instance's scope resolves its OCI references as it
// is set (an unknown one is refused), and an admin warms, lists and
// removes the cache; the other roles cannot.
func TestImageRoutes(t *testing.T) {
	imgs := &fakeImages{}
	e := newEnv(t, func(d *admin.Deps) { d.Images = imgs })
	acct := e.account()
	var in adminapi.Instance
	e.do(adminToken, http.MethodPost, "/instances", adminapi.CreateInstanceRequest{AccountID: acct,
		Scope: adminapi.Scope{Images: []string{"host", "reg.test/ok:1"}}}, &in)
	if !slices.Equal(imgs.resolved, []string{"reg.test/ok:1"}) {
		t.Errorf("resolved at instance create = %v; want the scope's OCI reference", imgs.resolved)
	}
	status, code := e.refused(adminToken, http.MethodPost, "/instances", adminapi.CreateInstanceRequest{AccountID: acct,
		Scope: adminapi.Scope{Images: []string{"reg.test/missing:1"}}})
	if status != http.StatusBadRequest || code != protocol.InvalidRequest {
		t.Errorf("instance with an unknown image = %d %s; want 400 invalid_request", status, code)
	}

	var lines []string
	img, err := e.client(adminToken).PullImage(t.Context(), "reg.test/ok:1", func(l string) { lines = append(lines, l) })
	if err != nil || img.Digest != "sha256:"+strings.Repeat("ab", 32) || len(lines) != 2 {
		t.Errorf("PullImage = %+v, %v, progress %q; want the image after two progress lines", img, err, lines)
	}
	_, err = e.client(adminToken).PullImage(t.Context(), "reg.test/missing:1", nil)
	var ae *adminapi.APIError
	if !errors.As(err, &ae) || ae.Code != protocol.NotFound {
		t.Errorf("PullImage of an unknown image = %v; want not_found", err)
	}
	list, err := e.client(adminToken).ListImages(t.Context())
	if err != nil || len(list) != 1 || list[0].InUse != 1 {
		t.Errorf("ListImages = %+v, %v", list, err)
	}
	if err := e.client(adminToken).RemoveImage(t.Context(), "reg.test/busy:1"); !errors.As(err, &ae) || ae.Status != http.StatusConflict {
		t.Errorf("RemoveImage of an image in use = %v; want 409", err)
	}
	if err := e.client(adminToken).RemoveImage(t.Context(), "reg.test/old:1"); err != nil {
		t.Errorf("RemoveImage = %v", err)
	}
	if status, _ := e.refused(operatorToken, http.MethodGet, "/images", nil); status != http.StatusForbidden {
		t.Errorf("an operator listing images = %d; want 403", status)
	}
}
