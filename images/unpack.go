package images

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Overlayfs markers: see the kernel's Documentation/filesystems/overlayfs.rst.
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
	paxXattrPrefix = "SCHILY.xattr."
)

// unpacker writes one layer's tar stream into an empty dir. Every path is
// walked one component at a time with O_NOFOLLOW from the layer's root fd,
// so neither a symlink in the layer nor a ".." ever leads outside it.
type unpacker struct {
	root  int
	limit int64 // unpacked bytes allowed
	size  int64
	dirs  []dirTime // mtimes to set last: creating children changes them
}

type dirTime struct {
	path  []string
	atime time.Time
	mtime time.Time
}

// unpackLayer unpacks the tar stream r into dir, converting whiteouts to
// overlayfs form, and returns the bytes of regular files it wrote. It fails
// with ErrTooLarge past limit bytes.
func unpackLayer(r io.Reader, dir string, limit int64) (int64, error) {
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open layer dir: %w", err)
	}
	defer unix.Close(root)
	if err := unix.Fchmod(root, 0o755); err != nil {
		return 0, err
	}
	u := &unpacker{root: root, limit: limit}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("read layer: %w", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return 0, fmt.Errorf("unpack %q: %w", hdr.Name, err)
		}
	}
	for i := len(u.dirs) - 1; i >= 0; i-- {
		d := u.dirs[i]
		if err := u.withParent(d.path, false, func(pfd int, base string) error {
			return setTimes(pfd, base, d.atime, d.mtime)
		}); err != nil {
			return 0, err
		}
	}
	return u.size, nil
}

// splitName cleans a tar entry name into components, refusing "..".
func splitName(name string) ([]string, error) {
	var parts []string
	for p := range strings.SplitSeq(name, "/") {
		switch p {
		case "", ".":
		case "..":
			return nil, errors.New("path escapes the layer")
		default:
			parts = append(parts, p)
		}
	}
	return parts, nil
}

// withParent opens the parent dir of path (creating missing dirs 0755 when
// create is set) without following symlinks and calls fn with its fd and
// the last component. An empty path means the layer's root itself: fn gets
// the root fd and ".".
func (u *unpacker) withParent(path []string, create bool, fn func(pfd int, base string) error) error {
	if len(path) == 0 {
		return fn(u.root, ".")
	}
	fd, err := unix.Dup(u.root)
	if err != nil {
		return err
	}
	defer func() { unix.Close(fd) }()
	for _, c := range path[:len(path)-1] {
		next, err := openDir(fd, c)
		if errors.Is(err, unix.ENOENT) && create {
			if err := unix.Mkdirat(fd, c, 0o755); err != nil {
				return err
			}
			next, err = openDir(fd, c)
		}
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return fmt.Errorf("parent %q is not a directory in this layer", c)
			}
			return err
		}
		unix.Close(fd)
		fd = next
	}
	return fn(fd, path[len(path)-1])
}

func openDir(dirfd int, name string) (int, error) {
	return unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// clear removes what a later entry of the same name replaces; a dir stays
// when keepDir is set (a dir entry over an implicit dir only sets metadata).
func clear(pfd int, base string, keepDir bool) (isDir bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return true, nil
		}
		return false, unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR)
	}
	return false, unix.Unlinkat(pfd, base, 0)
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	path, err := splitName(hdr.Name)
	if err != nil {
		return err
	}
	if len(path) > 0 {
		base := path[len(path)-1]
		if base == whiteoutOpaque {
			return u.withParent(path[:len(path)-1], true, func(pfd int, dbase string) error {
				// The marker may come before its dir's own entry.
				if err := unix.Mkdirat(pfd, dbase, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
					return err
				}
				return setXattr(pfd, dbase, opaqueXattr, []byte("y"))
			})
		}
		if strings.HasPrefix(base, whiteoutMeta) {
			return nil // other AUFS bookkeeping (.wh..wh.plnk…) has no overlay form
		}
		if hidden, ok := strings.CutPrefix(base, whiteoutPrefix); ok {
			wpath := append(path[:len(path)-1:len(path)-1], hidden)
			return u.withParent(wpath, true, func(pfd int, base string) error {
				if _, err := clear(pfd, base, false); err != nil {
					return err
				}
				if err := unix.Mknodat(pfd, base, unix.S_IFCHR, 0); err != nil {
					return err
				}
				return unix.Fchownat(pfd, base, 0, 0, unix.AT_SYMLINK_NOFOLLOW)
			})
		}
	}
	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		if len(path) == 0 {
			return u.setMeta(u.root, ".", hdr, mode, true)
		}
		err := u.withParent(path, true, func(pfd int, base string) error {
			isDir, err := clear(pfd, base, true)
			if err != nil {
				return err
			}
			if !isDir {
				if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
					return err
				}
			}
			if err := u.setMeta(pfd, base, hdr, mode, false); err != nil {
				return err
			}
			return u.setPAXXattrs(pfd, base, hdr)
		})
		if err == nil {
			u.dirs = append(u.dirs, dirTime{path: path, atime: atime(hdr), mtime: hdr.ModTime})
		}
		return err
	case tar.TypeReg:
		if len(path) == 0 {
			return errors.New("file at the layer's root")
		}
		u.size += hdr.Size
		if u.size > u.limit {
			return ErrTooLarge
		}
		return u.withParent(path, true, func(pfd int, base string) error {
			if _, err := clear(pfd, base, false); err != nil {
				return err
			}
			fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
			if err != nil {
				return err
			}
			f := os.NewFile(uintptr(fd), base)
			_, err = io.CopyN(f, r, hdr.Size)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			// After chown, which clears security.capability.
			if err := u.setMeta(pfd, base, hdr, mode, true); err != nil {
				return err
			}
			return u.setPAXXattrs(pfd, base, hdr)
		})
	case tar.TypeSymlink:
		return u.create(path, hdr, func(pfd int, base string) error {
			return unix.Symlinkat(hdr.Linkname, pfd, base)
		})
	case tar.TypeLink:
		target, err := splitName(hdr.Linkname)
		if err != nil {
			return err
		}
		if len(target) == 0 {
			return errors.New("hard link to the layer's root")
		}
		return u.withParent(target, false, func(tfd int, tbase string) error {
			return u.withParent(path, true, func(pfd int, base string) error {
				if _, err := clear(pfd, base, false); err != nil {
					return err
				}
				return unix.Linkat(tfd, tbase, pfd, base, 0)
			})
		})
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		dev := int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
		return u.create(path, hdr, func(pfd int, base string) error {
			return unix.Mknodat(pfd, base, kind|mode, dev)
		})
	default:
		return nil // pax/GNU bookkeeping entries the tar reader did not fold in
	}
}

// create makes a non-directory, non-regular entry with mk and sets its
// ownership, mode and times.
func (u *unpacker) create(path []string, hdr *tar.Header, mk func(pfd int, base string) error) error {
	if len(path) == 0 {
		return errors.New("entry at the layer's root")
	}
	return u.withParent(path, true, func(pfd int, base string) error {
		if _, err := clear(pfd, base, false); err != nil {
			return err
		}
		if err := mk(pfd, base); err != nil {
			return err
		}
		return u.setMeta(pfd, base, hdr, uint32(hdr.Mode)&0o7777, hdr.Typeflag != tar.TypeDir)
	})
}

// setMeta sets ownership, then mode (chown clears set-id bits), then times
// unless the entry is a dir, whose times are set after its children.
func (u *unpacker) setMeta(pfd int, base string, hdr *tar.Header, mode uint32, times bool) error {
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeSymlink {
		if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
			return err
		}
	}
	if !times {
		return nil
	}
	return setTimes(pfd, base, atime(hdr), hdr.ModTime)
}

func atime(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}

func setTimes(pfd int, base string, at, mt time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}
	return unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// setPAXXattrs applies the tar's extended attributes (file capabilities,
// user.*), never trusted.*: those would let an image forge overlay markers.
func (u *unpacker) setPAXXattrs(pfd int, base string, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattrPrefix)
		if !ok || strings.HasPrefix(name, "trusted.") {
			continue
		}
		if err := setXattr(pfd, base, name, []byte(v)); err != nil {
			return err
		}
	}
	return nil
}

// setXattr sets an xattr on the dir or file base under pfd, through an fd
// opened without following symlinks.
func setXattr(pfd int, base, name string, value []byte) error {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsetxattr(fd, name, value, 0)
}
