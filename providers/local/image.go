package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// A workspace on an OCI image (any CreateSpec.Image but "" and [Image])
// has the image as its root: an overlayfs whose lower layers are the
// image's unpacked layers, shared read-only by every workspace on it, each
// seen through an idmapped mount that maps only the image's uid 0 to the
// workspace's uid, and whose upper layer is rootfs/ on the workspace's
// disk, under its quota. /workspace, /root and /tmp, /proc, /dev and
// /etc/hosts and /etc/nsswitch.conf are mounted on it as on [Image]. See
// README.md, "Images".

// RootImage is an OCI image, pulled and unpacked, as [Images] hands it out.
type RootImage struct {
	Digest string   // the manifest's digest, "sha256:…"
	Layers []string // absolute directories of the unpacked layers, bottom first
	// Env, WorkingDir and User are the image config's.
	Env        []string
	WorkingDir string
	User       string
}

// Images gives the local provider its OCI images (internal/broker adapts
// the image store, package images).
type Images interface {
	// Acquire makes the image ref (a tag or a digest reference) present
	// and keeps it so (no eviction) until release is called; release may
	// be called more than once.
	Acquire(ctx context.Context, ref string) (img RootImage, release func(), err error)
}

// ErrImageUser is returned by Create for an image whose config names a
// user other than root: a sandbox maps only its uid 0 to a host uid.
var ErrImageUser = fmt.Errorf("local: create: the image runs as a user other than root, which this provider's sandboxes cannot map: %w", providers.ErrImageUnavailable)

// imageRecord is the image a workspace runs on, in sandbox.json.
type imageRecord struct {
	Ref        string   `json:"ref"`    // as asked
	Digest     string   `json:"digest"` // what it ran
	Layers     []string `json:"layers"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
}

// imageRoot is the part of a root tree (rootTree.image) that makes it an
// image's: the overlay's layers and its upper directory's parent.
type imageRoot struct {
	layers  []string // bottom first
	rootfs  string   // holds upper/ and work/
	unshare string   // unshare(1), which makes the idmapping's user namespace
}

// rootfsName is the directory of the workspace's disk (or of its host
// directory) that holds the overlay's upper/ and work/.
const rootfsName = "rootfs"

// acquireImage pins ref in the provider's image store for a new workspace.
func (p *Provider) acquireImage(ctx context.Context, ref string) (*imageRecord, func(), error) {
	if p.cfg.Images == nil {
		return nil, nil, errors.New("local: create: unknown image; this broker has no image store, so the only image is " + Image)
	}
	if p.probeUID <= 0 || !p.rootTrees || p.unshare == "" {
		return nil, nil, errors.New("local: create: images need a broker that runs as root on Linux 5.12 or later, with unshare (util-linux)")
	}
	img, release, err := p.cfg.Images.Acquire(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	if !rootUser(img.User) {
		release()
		return nil, nil, ErrImageUser
	}
	if len(img.Layers) == 0 {
		release()
		return nil, nil, errors.New("local: create: the image has no layers")
	}
	return &imageRecord{Ref: ref, Digest: img.Digest, Layers: slices.Clone(img.Layers), Env: slices.Clone(img.Env), WorkingDir: img.WorkingDir}, release, nil
}

// rootUser reports whether an image config's User is root ("", "0",
// "root", with or without a root group).
func rootUser(u string) bool {
	user, group, _ := strings.Cut(u, ":")
	isRoot := func(s string) bool { return s == "" || s == "0" || s == "root" }
	return isRoot(user) && isRoot(group)
}

// imagePins holds each image workspace's pin on its image.
type imagePins struct {
	mu sync.Mutex
	m  map[string]func() // ref → release
}

func (ps *imagePins) put(ref string, release func()) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m == nil {
		ps.m = make(map[string]func())
	}
	if old := ps.m[ref]; old != nil {
		old()
	}
	ps.m[ref] = release
}

// drop releases ref's pin, if it has one.
func (ps *imagePins) drop(ref string) {
	ps.mu.Lock()
	release := ps.m[ref]
	delete(ps.m, ref)
	ps.mu.Unlock()
	if release != nil {
		release()
	}
}

// repinImages pins the images of the workspaces a previous broker left,
// so that the store does not evict an image a live workspace runs on.
func (p *Provider) repinImages(ctx context.Context) {
	if p.cfg.Images == nil {
		return
	}
	entries, _ := os.ReadDir(filepath.Join(p.dataDir, workspacesDir))
	for _, e := range entries {
		ref := e.Name()
		if checkRef(ref) != nil {
			continue
		}
		var rec record
		if readJSON(p.layout(ref).sandbox(), &rec) != nil || rec.Image == nil {
			continue
		}
		_, release, err := p.cfg.Images.Acquire(ctx, digestRef(rec.Image.Ref, rec.Image.Digest))
		if err != nil {
			p.log.Warn("image of a live workspace not pinned", sandgate.WorkspaceAttr(ref), "digest", rec.Image.Digest, sandgate.KeyError, err)
			continue
		}
		p.pins.put(ref, release)
	}
}

// imageEnv is the environment of an exec of w: the image's Env under the
// workspace's own (which wins for a name both set).
func imageEnv(w opened) map[string]string {
	if w.rec.Image == nil || len(w.rec.Image.Env) == 0 {
		return w.env
	}
	env := make(map[string]string, len(w.rec.Image.Env)+len(w.env))
	for _, kv := range w.rec.Image.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	for k, v := range w.env {
		env[k] = v
	}
	return env
}

// imageDir is the working directory of an exec of w that names none.
func imageDir(w opened) string {
	if w.rec.Image != nil && strings.HasPrefix(w.rec.Image.WorkingDir, "/") {
		return w.rec.Image.WorkingDir
	}
	return defaultDir
}

// imageRootTree turns t, the root tree of j (rootOptions), into the image's
// when j's workspace runs on one: the overlay replaces the host's /usr, and
// only /etc/hosts and /etc/nsswitch.conf of the generated /etc are bound
// over the image's own.
func (p *Provider) imageRootTree(j job, t *rootTree) {
	img := j.rec.Image
	if img == nil {
		return
	}
	rootfs := filepath.Join(string(j.layout), rootfsName)
	if j.disk != "" {
		rootfs = p.stageDir + "/d/" + rootfsName
	}
	t.image = &imageRoot{layers: img.Layers, rootfs: rootfs, unshare: p.unshare}
	t.usrLinks = nil
	t.binds = slices.DeleteFunc(t.binds, func(b rootBind) bool { return b.ro })
	for _, name := range imageEtcFiles {
		t.files = append(t.files, rootBind{src: filepath.Join(p.etcDir, name), dst: "/etc/" + name, ro: true})
	}
	t.keepPaths = append(t.keepPaths, p.unshare)
	t.keepTrees = append(t.keepTrees, img.Layers...)
	if j.disk == "" {
		t.keepTrees = append(t.keepTrees, rootfs)
	}
}

// imageEtcFiles are the generated /etc files bound over an image's: the
// sandbox's own name and how names resolve. The image keeps its passwd and
// group, which its packages' users need.
var imageEtcFiles = []string{"hosts", "nsswitch.conf"}

// sameImageRoot reports whether a and b are the same image root (or both none).
func sameImageRoot(a, b *imageRoot) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.rootfs == b.rootfs && a.unshare == b.unshare && slices.Equal(a.layers, b.layers)
}

// imageDigest is the digest of rec's image, "" for [Image].
func imageDigest(rec record) string {
	if rec.Image == nil {
		return ""
	}
	return rec.Image.Digest
}

// digestRef is the reference of digest in ref's repository: ref without
// its tag or digest, then "@" and digest.
func digestRef(ref, digest string) string {
	repo, _, _ := strings.Cut(ref, "@")
	if i := strings.LastIndexByte(repo, ':'); i > strings.LastIndexByte(repo, '/') {
		repo = repo[:i]
	}
	return repo + "@" + digest
}

// images is the provider's Capabilities.Images: [Image] alone, or with an
// image store any image (nil), which a create then pulls.
func (p *Provider) images() []string {
	if p.cfg.Images != nil && p.unshare != "" && p.probeUID > 0 && p.rootTrees {
		return nil
	}
	return []string{Image}
}

// snapshotImage is what a snapshot of a workspace on an image keeps
// beside its archive (<id>.image.json): the image it was taken on, which
// a restore into a workspace on the same image's repository runs on.
type snapshotImage struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// snapshotImagePath is the image record of snapshot id; id must be checked.
func (p *Provider) snapshotImagePath(id string) string {
	return filepath.Join(p.dataDir, snapshotsDir, id+".image.json")
}

// writeSnapshotImage records the image of w, if any, for snapshot id.
func (p *Provider) writeSnapshotImage(id string, w opened) error {
	if w.rec.Image == nil {
		return nil
	}
	return replaceJSON(p.snapshotImagePath(id), ".tmp-"+id+"-", snapshotImage{Ref: w.rec.Image.Ref, Digest: w.rec.Image.Digest})
}

// restoreImage moves w, a workspace on an image that nothing has run on
// yet (a warm start), onto the image snapshot id was taken on when that
// is another digest of the same repository: a tag that moved on since
// still restores onto the digest the snapshot's files were made for. The
// digest is pulled again when the store no longer has it; when it cannot
// be (no longer in the registry, or refused), the restore fails. A
// snapshot of another repository, or of the host image, leaves w's image
// as it is.
func (p *Provider) restoreImage(ctx context.Context, ref string, w opened, id string) error {
	var si snapshotImage
	if w.rec.Image == nil || readJSON(p.snapshotImagePath(id), &si) != nil || si.Digest == "" || si.Digest == w.rec.Image.Digest {
		return nil
	}
	if digestRef(si.Ref, "") != digestRef(w.rec.Image.Ref, "") {
		return nil
	}
	img, release, err := p.acquireImage(ctx, digestRef(w.rec.Image.Ref, si.Digest))
	if err != nil {
		return fmt.Errorf("the snapshot's image: %w", err)
	}
	rec := w.rec
	img.Ref = w.rec.Image.Ref
	rec.Image = img
	// Off the old root before the record names the new one: the next
	// exec builds the namespace on the snapshot's layers.
	p.ns.drop(ref)
	if err := replaceJSON(p.layout(ref).sandbox(), ".tmp-sandbox-", rec); err != nil {
		release()
		return fmt.Errorf("record: %w", scrub(err))
	}
	p.pins.put(ref, release) // and the old image's pin goes
	p.log.Info("workspace moved onto the snapshot's image", sandgate.WorkspaceAttr(ref), "digest", si.Digest)
	return nil
}
