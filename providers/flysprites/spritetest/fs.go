package spritetest

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/providers/internal/fakeserver"
)

// The fs API (sheet §6) works on the sprite's whole file system as a
// process of the guest outside every jail sees it: /tmp, /workspace and
// /root are the workspace's host directories, and every other path is
// reached through the guest's mount namespace (guestRoot). Symlinks are
// followed across them (follow), as the vendor's agent, a root process
// of the guest, would; each part is then opened as an os.Root so that
// nothing leads out of the guest.
var mounts = map[string]string{"/tmp": "tmp", "/workspace": "workspace", "/root": "home"}

// hostPath is where the guest's absolute, clean path p is on the host.
func (sp *sprite) hostPath(p string) (string, error) {
	for m, dir := range mounts {
		if p == m || strings.HasPrefix(p, m+"/") {
			return filepath.Join(sp.s.data, "workspaces", sp.lsb.Ref, dir, strings.TrimPrefix(p, m)), nil
		}
	}
	gr, err := sp.guestRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(gr, p), nil
}

// follow resolves the symlinks of the guest's absolute path p, the last
// one's too, as open(2) in the guest would; a missing part is kept as it
// is, for a write to create.
func (sp *sprite) follow(p string) (string, error) {
	done, rest := "/", strings.Split(p, "/")
	for links := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			done = path.Dir(done)
			continue
		}
		next := path.Join(done, c)
		host, err := sp.hostPath(next)
		if err != nil {
			return "", err
		}
		fi, err := os.Lstat(host)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			done = next
			continue
		}
		if links++; links > 40 {
			return "", syscall.ELOOP
		}
		target, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			done = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return done, nil
}

// resolve maps an absolute sprite path to a root and a path inside it.
func (sp *sprite) resolve(p, workingDir string) (*os.Root, string, error) {
	if !path.IsAbs(p) {
		p = path.Join(workingDir, p)
	}
	p, err := sp.follow(path.Clean(p))
	if err != nil {
		return nil, "", err
	}
	for m, dir := range mounts {
		if p == m || strings.HasPrefix(p, m+"/") {
			root, err := os.OpenRoot(filepath.Join(sp.s.data, "workspaces", sp.lsb.Ref, dir))
			if err != nil {
				return nil, "", err
			}
			rel := strings.TrimPrefix(strings.TrimPrefix(p, m), "/")
			if rel == "" {
				rel = "."
			}
			return root, rel, nil
		}
	}
	gr, err := sp.guestRoot()
	if err != nil {
		return nil, "", err
	}
	root, err := os.OpenRoot(gr)
	if err != nil {
		return nil, "", err
	}
	rel := strings.TrimPrefix(p, "/")
	if rel == "" {
		rel = "."
	}
	return root, rel, nil
}

// guestRoot is the guest's / as the host reaches it: /proc/PID/root of a
// process in the guest's mount namespace, found once and checked on
// every use (the pid may have ended and been reused).
func (sp *sprite) guestRoot() (string, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.rootPID != 0 && fakeserver.GuestRootValid(sp.rootPID, sp.mntNS) {
		return "/proc/" + strconv.Itoa(sp.rootPID) + "/root", nil
	}
	root, pid, err := fakeserver.GuestRoot(sp.mntNS)
	if err != nil {
		return "", err
	}
	sp.rootPID = pid
	return root, nil
}

// fsFail answers an error of the file system in the fs API's body.
func fsFail(w http.ResponseWriter, p string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		fsErr(w, http.StatusNotFound, "not_found", p)
	case errors.Is(err, fs.ErrPermission):
		fsErr(w, http.StatusForbidden, "permission_denied", p)
	case errors.Is(err, syscall.ENOTDIR):
		fsErr(w, http.StatusBadRequest, "not_a_directory", p)
	case errors.Is(err, syscall.EISDIR):
		fsErr(w, http.StatusBadRequest, "is_a_directory", p)
	default:
		fsErr(w, http.StatusInternalServerError, "internal", p)
	}
}

func (s *Server) fsOpen(w http.ResponseWriter, r *http.Request) (*sprite, *os.Root, string, string, bool) {
	sp := s.spriteOr404(w, r)
	if sp == nil {
		return nil, nil, "", "", false
	}
	q := r.URL.Query()
	p := q.Get("path")
	if p == "" || !q.Has("workingDir") { // sprites-go sends workingDir on every call (sheet §6)
		fsErr(w, http.StatusBadRequest, "invalid_path", p)
		return nil, nil, "", "", false
	}
	root, rel, err := sp.resolve(p, q.Get("workingDir"))
	if err != nil {
		fsFail(w, p, err)
		return nil, nil, "", "", false
	}
	return sp, root, rel, p, true
}

func (s *Server) fsRead(w http.ResponseWriter, r *http.Request) {
	_, root, rel, p, ok := s.fsOpen(w, r)
	if !ok {
		return
	}
	defer root.Close()
	f, err := root.Open(rel)
	if err != nil {
		fsFail(w, p, err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		fsFail(w, p, err)
		return
	}
	if st.IsDir() {
		fsFail(w, p, syscall.EISDIR)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	io.Copy(w, f)
}

func (s *Server) fsWrite(w http.ResponseWriter, r *http.Request) {
	_, root, rel, p, ok := s.fsOpen(w, r)
	if !ok {
		return
	}
	defer root.Close()
	q := r.URL.Query()
	mode := fs.FileMode(0o644)
	if m := q.Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o7777 {
			fsErr(w, http.StatusBadRequest, "invalid_mode", p)
			return
		}
		mode = fs.FileMode(v)
	}
	if rel == "." {
		fsFail(w, p, syscall.EISDIR)
		return
	}
	if dir := path.Dir(rel); dir != "." {
		if q.Get("mkdirParents") == "true" || q.Get("mkdir") == "true" {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				fsFail(w, p, err)
				return
			}
		}
	}
	if st, err := root.Stat(rel); err == nil && st.IsDir() {
		fsFail(w, p, syscall.EISDIR)
		return
	}
	var b [8]byte
	rand.Read(b[:])
	tmp := path.Join(path.Dir(rel), ".fs-write-"+hex.EncodeToString(b[:]))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		fsFail(w, p, err)
		return
	}
	n, err := io.Copy(f, r.Body)
	err = errors.Join(err, f.Chmod(mode), f.Close())
	if err == nil {
		err = root.Rename(tmp, rel)
	}
	if err != nil {
		root.Remove(tmp)
		fsFail(w, p, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": p, "size": n, "mode": fmt.Sprintf("%04o", mode)})
}

func entryOf(dir string, fi fs.FileInfo) map[string]any {
	typ := "file"
	if fi.IsDir() {
		typ = "directory"
	}
	return map[string]any{"name": fi.Name(), "path": path.Join(dir, fi.Name()), "type": typ, "size": fi.Size(),
		"mode": fmt.Sprintf("%04o", fi.Mode().Perm()), "modTime": fi.ModTime().UTC().Format(time.RFC3339), "isDir": fi.IsDir()}
}

// fsList lists a directory's entries, or a file as its one entry.
func (s *Server) fsList(w http.ResponseWriter, r *http.Request) {
	_, root, rel, p, ok := s.fsOpen(w, r)
	if !ok {
		return
	}
	defer root.Close()
	p = path.Clean(p)
	st, err := root.Stat(rel)
	if err != nil {
		fsFail(w, p, err)
		return
	}
	entries := []map[string]any{}
	if !st.IsDir() {
		entries = append(entries, entryOf(path.Dir(p), st))
	} else {
		f, err := root.Open(rel)
		if err != nil {
			fsFail(w, p, err)
			return
		}
		des, err := f.ReadDir(-1)
		f.Close()
		if err != nil {
			fsFail(w, p, err)
			return
		}
		for _, de := range des {
			if fi, err := de.Info(); err == nil {
				entries = append(entries, entryOf(p, fi))
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": p, "entries": entries, "count": len(entries)})
}

func (s *Server) fsDelete(w http.ResponseWriter, r *http.Request) {
	_, root, rel, p, ok := s.fsOpen(w, r)
	if !ok {
		return
	}
	defer root.Close()
	if _, err := root.Lstat(rel); err != nil {
		fsFail(w, p, err)
		return
	}
	var err error
	if r.URL.Query().Get("recursive") == "true" {
		err = root.RemoveAll(rel)
	} else {
		err = root.Remove(rel)
	}
	if err != nil {
		fsFail(w, p, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": p})
}

// Checkpoints (sheet §7): a copy of the sprite's writable directories,
// restored in place only; create and restore answer NDJSON streams.
type checkpoint struct {
	ID         string    `json:"id"`
	CreateTime time.Time `json:"create_time"`
	Comment    string    `json:"comment,omitempty"`
}

func ndjson(w http.ResponseWriter) func(typ, data, errText string) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	return func(typ, data, errText string) {
		m := map[string]any{"type": typ, "time": time.Now().UTC().Format(time.RFC3339Nano)}
		if data != "" {
			m["data"] = data
		}
		if errText != "" {
			m["error"] = errText
		}
		b, _ := json.Marshal(m)
		bw.Write(append(b, '\n'))
		bw.Flush()
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
}

func (sp *sprite) checkpointDir(id string) string {
	return filepath.Join(sp.s.data, "..", "checkpoints", sp.name, id)
}

func (s *Server) checkpoint(w http.ResponseWriter, r *http.Request) {
	sp := s.spriteOr404(w, r)
	if sp == nil {
		return
	}
	var body struct {
		Comment string `json:"comment"`
	}
	json.NewDecoder(r.Body).Decode(&body)
	sp.mu.Lock()
	id := "v" + strconv.Itoa(len(sp.checkpoints)+1)
	sp.mu.Unlock()
	line := ndjson(w)
	line("info", "Creating checkpoint", "")
	dst := sp.checkpointDir(id)
	if err := copyTree(filepath.Join(sp.s.data, "workspaces", sp.lsb.Ref), dst); err != nil {
		line("error", "", "checkpoint failed")
		return
	}
	sp.mu.Lock()
	sp.checkpoints = append(sp.checkpoints, checkpoint{ID: id, CreateTime: time.Now().UTC(), Comment: body.Comment})
	sp.mu.Unlock()
	line("info", "Checkpoint "+id+" created", "")
	line("complete", "", "")
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	sp := s.spriteOr404(w, r)
	if sp == nil {
		return
	}
	sp.mu.Lock()
	out := append([]checkpoint{}, sp.checkpoints...)
	sp.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getCheckpoint(w http.ResponseWriter, r *http.Request) {
	sp := s.spriteOr404(w, r)
	if sp == nil {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, c := range sp.checkpoints {
		if c.ID == r.PathValue("id") {
			writeJSON(w, http.StatusOK, c)
			return
		}
	}
	http.Error(w, "no such checkpoint", http.StatusNotFound)
}

// restoreCheckpoint rolls the same sprite back: its writable directories
// are replaced by the checkpoint's copy. Running processes are not stopped
// by the fake (the vendor stops them).
func (s *Server) restoreCheckpoint(w http.ResponseWriter, r *http.Request) {
	sp := s.spriteOr404(w, r)
	if sp == nil {
		return
	}
	id := r.PathValue("id")
	src := sp.checkpointDir(id)
	if _, err := os.Stat(src); err != nil {
		http.Error(w, "no such checkpoint", http.StatusNotFound)
		return
	}
	line := ndjson(w)
	line("info", "Restoring "+id, "")
	for _, d := range []string{"workspace", "home"} {
		dst := filepath.Join(sp.s.data, "workspaces", sp.lsb.Ref, d)
		if err := os.RemoveAll(dst); err != nil {
			line("error", "", "restore failed")
			return
		}
		if err := copyTree(filepath.Join(src, d), dst); err != nil {
			line("error", "", "restore failed")
			return
		}
	}
	line("complete", "", "")
}

// copyTree copies a directory with cp -a (modes, links and all).
func copyTree(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	return exec.Command("cp", "-a", "--", src, dst).Run()
}
