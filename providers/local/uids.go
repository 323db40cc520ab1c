package local

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// A uid claim, uids/<uid>, is made by Create before the workspace's
// sandbox.json (which records the uid) exists, so a create killed in
// between leaves a claim nothing records. Two things give such a claim
// back: Terminate of a workspace without sandbox.json frees every claim
// naming it (releaseClaimsOf), and New frees every claim whose workspace
// directory is gone and whose uid no process runs as (sweepUIDs).

// releaseClaimsOf frees every uid claim that names the workspace ref.
func (p *Provider) releaseClaimsOf(ref string) {
	dir := filepath.Join(p.dataDir, uidsDir)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		name := filepath.Join(dir, e.Name())
		if b, err := os.ReadFile(name); err == nil && string(b) == ref {
			os.Remove(name)
		}
	}
}

// sweepUIDs frees the uid claims of workspaces that are gone (no
// directory under workspaces/) and whose uid no process runs as any more.
// A create makes its directory before it claims, so a create in flight in
// another broker process is never hit.
func (p *Provider) sweepUIDs() {
	dir := filepath.Join(p.dataDir, uidsDir)
	entries, _ := os.ReadDir(dir)
	var live map[uint32]bool // read once, when a claim needs it
	for _, e := range entries {
		uid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		name := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		ref := string(b)
		if p.pooledClaim(ref) {
			continue // a warm workspace's (pool.go)
		}
		if checkRef(ref) == nil {
			if _, err := os.Lstat(string(p.layout(ref))); !errors.Is(err, fs.ErrNotExist) {
				continue // a workspace, or one in the making
			}
		}
		if live == nil {
			live = procUIDs()
		}
		if live[uint32(uid)] {
			continue // its processes are still dying
		}
		if os.Remove(name) == nil {
			p.log.Info("uid claim of a gone workspace freed", "uid", uid)
		}
	}
}

// procUIDs returns the uids that processes of this host run as (the owner
// of /proc/<pid> is the process's effective uid).
func procUIDs() map[uint32]bool {
	out := map[uint32]bool{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			out[st.Uid] = true
		}
	}
	return out
}
