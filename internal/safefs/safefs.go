// Package safefs opens files beneath a directory without following
// symlinks and without blocking on special files. cryo runs as root and
// reads directories that others write: a file store that several parties
// share, containerd's checkpoint directory (extracted from an image), the
// node cache. A symlink there would let the writer point root at any host
// file; a FIFO where a blob should be would block a reader forever.
//
// Every path is resolved by the kernel relative to an open directory with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS): no
// component may be a symlink, "..", or leave the directory, checked
// atomically with the open, so there is no window between a check and the
// use. Go's os.Root is not enough: it refuses escapes but follows symlinks
// that stay inside the root. Kernels without openat2 (before 5.6) get the
// same guarantee from a walk of openat(O_NOFOLLOW) one component at a time.
// Files are opened O_NONBLOCK and fstat'ed: anything but a regular file
// (FIFO, socket, device) is refused at once.
package safefs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// ErrUnsafe is wrapped (with errdefs.ErrInvalidArgument) by every refusal
// of a symlink, a special file, or a name that leaves the directory.
var ErrUnsafe = errors.New("symlink, special file or path outside the directory")

// Dir is an open directory; names under it never follow symlinks.
type Dir struct {
	f *os.File
}

// OpenDir opens the directory at path, which the caller trusts (the node's
// own configuration): symlinks in path itself are followed.
func OpenDir(path string) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return &Dir{f: os.NewFile(uintptr(fd), path)}, nil
}

// MkdirAllNoFollow creates the absolute path (0700 for new directories)
// and opens it without following a symlink in any of its components: for
// a path whose components others may have written.
func MkdirAllNoFollow(path string) (*Dir, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%s: not an absolute path: %w", path, errdefs.ErrInvalidArgument)
	}
	root, err := OpenDir("/")
	if err != nil {
		return nil, err
	}
	defer root.Close()
	rel := strings.TrimPrefix(filepath.Clean(path), "/")
	if rel == "" {
		return OpenDir("/")
	}
	return root.MkdirAll(rel, 0o700)
}

// Close closes the directory.
func (d *Dir) Close() error { return d.f.Close() }

// Name is the path the directory was opened by.
func (d *Dir) Name() string { return d.f.Name() }

func (d *Dir) fd() int { return int(d.f.Fd()) }

func (d *Dir) path(name string) string { return filepath.Join(d.f.Name(), name) }

// unsafeErr reports a refusal: a symlink (ELOOP), an escape (EXDEV), or a
// file that is not what the caller asked for.
func (d *Dir) unsafeErr(name, what string) error {
	return fmt.Errorf("%s: %s: %w: %w", d.path(name), what, ErrUnsafe, errdefs.ErrInvalidArgument)
}

// checkName refuses names that are absolute, hold "..", or are not clean:
// every name the callers make is a plain relative path.
func (d *Dir) checkName(name string) error {
	if !filepath.IsLocal(name) || filepath.Clean(name) != name || strings.Contains(name, "\x00") {
		return d.unsafeErr(name, "not a plain relative path")
	}
	return nil
}

// noOpenat2 is set when the kernel lacks openat2 (or a test wants the
// walk).
var noOpenat2 atomic.Bool

// openat resolves name beneath d without following symlinks and opens it
// with flags (O_CLOEXEC and O_NOFOLLOW are added).
func (d *Dir) openat(name string, flags int, mode uint32) (int, error) {
	if err := d.checkName(name); err != nil {
		return -1, err
	}
	flags |= unix.O_CLOEXEC | unix.O_NOFOLLOW
	if flags&unix.O_CREAT == 0 {
		mode = 0 // openat2 refuses a mode without O_CREAT
	}
	if !noOpenat2.Load() {
		how := unix.OpenHow{Flags: uint64(flags), Mode: uint64(mode), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
		for tries := 0; ; tries++ {
			fd, err := unix.Openat2(d.fd(), name, &how)
			// EAGAIN: a concurrent rename raced the lookup.
			if (err == unix.EAGAIN || err == unix.EINTR) && tries < 64 {
				continue
			}
			if err == unix.ENOSYS {
				noOpenat2.Store(true)
				break
			}
			return fd, d.mapErr(name, err)
		}
	}
	return d.walk(name, flags, mode)
}

// walk opens name one component at a time with O_NOFOLLOW: each
// directory is opened relative to the one before it, so no component can
// be swapped for a symlink between a check and its use.
func (d *Dir) walk(name string, flags int, mode uint32) (int, error) {
	parts := strings.Split(name, "/")
	dirfd := d.fd()
	for i, p := range parts[:len(parts)-1] {
		fd, err := unix.Openat(dirfd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if dirfd != d.fd() {
			unix.Close(dirfd)
		}
		if err != nil {
			return -1, d.mapErr(strings.Join(parts[:i+1], "/"), err)
		}
		dirfd = fd
	}
	fd, err := unix.Openat(dirfd, parts[len(parts)-1], flags, mode)
	if dirfd != d.fd() {
		unix.Close(dirfd)
	}
	return fd, d.mapErr(name, err)
}

func (d *Dir) mapErr(name string, err error) error {
	switch {
	case err == nil:
		return nil
	case err == unix.ELOOP || err == unix.EXDEV:
		return d.unsafeErr(name, "a symlink or outside the directory")
	case err == unix.ENXIO:
		return d.unsafeErr(name, "a socket or a FIFO without a writer")
	case err == unix.ENOTDIR:
		// A component that should be a directory is a symlink or a file.
		return d.unsafeErr(name, "a path component is not a directory")
	}
	return &fs.PathError{Op: "open", Path: d.path(name), Err: err}
}

// OpenFile opens the regular file name beneath d (flag as os.OpenFile;
// O_CREATE makes it with perm). Symlinks, FIFOs, sockets and devices are
// refused without blocking.
func (d *Dir) OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	fd, err := d.openat(name, flag|unix.O_NONBLOCK, uint32(perm.Perm()))
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "fstat", Path: d.path(name), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, d.unsafeErr(name, "not a regular file")
	}
	// O_NONBLOCK means nothing to a regular file; clear it anyway so
	// that the os package treats the file like any other.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), d.path(name)), nil
}

// Open opens the regular file name for reading.
func (d *Dir) Open(name string) (*os.File, error) { return d.OpenFile(name, os.O_RDONLY, 0) }

// ReadFile reads the regular file name whole, refusing one longer than
// limit bytes (without reading more than limit+1).
func (d *Dir) ReadFile(name string, limit int64) ([]byte, error) {
	f, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes: %w", f.Name(), limit, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// Lstat describes name without following it (a symlink reports as one).
func (d *Dir) Lstat(name string) (fs.FileInfo, error) {
	fd, err := d.openat(name, unix.O_PATH, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), d.path(name))
	defer f.Close()
	return f.Stat()
}

// Sub opens the directory name beneath d.
func (d *Dir) Sub(name string) (*Dir, error) {
	fd, err := d.openat(name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	return &Dir{f: os.NewFile(uintptr(fd), d.path(name))}, nil
}

// MkdirAll creates the directories of name beneath d (with perm) and opens
// the last one. An existing component must be a directory, not a symlink.
func (d *Dir) MkdirAll(name string, perm os.FileMode) (*Dir, error) {
	if err := d.checkName(name); err != nil {
		return nil, err
	}
	cur := d
	for _, p := range strings.Split(name, "/") {
		if err := unix.Mkdirat(cur.fd(), p, uint32(perm.Perm())); err != nil && err != unix.EEXIST {
			return nil, closeAnd(cur, d, &fs.PathError{Op: "mkdir", Path: cur.path(p), Err: err})
		}
		next, err := cur.Sub(p)
		if cur != d {
			cur.Close()
		}
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}

func closeAnd(cur, d *Dir, err error) error {
	if cur != d {
		cur.Close()
	}
	return err
}

// Rename renames the entry old of d to new in nd (both single names).
func (d *Dir) Rename(old string, nd *Dir, new string) error {
	if err := d.checkBase(old); err != nil {
		return err
	}
	if err := nd.checkBase(new); err != nil {
		return err
	}
	if err := unix.Renameat(d.fd(), old, nd.fd(), new); err != nil {
		return &os.LinkError{Op: "rename", Old: d.path(old), New: nd.path(new), Err: err}
	}
	return nil
}

// Remove removes the file (or empty directory) name of d, a single name;
// a symlink is removed, never followed.
func (d *Dir) Remove(name string) error {
	if err := d.checkBase(name); err != nil {
		return err
	}
	err := unix.Unlinkat(d.fd(), name, 0)
	if err == unix.EISDIR {
		err = unix.Unlinkat(d.fd(), name, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return &fs.PathError{Op: "remove", Path: d.path(name), Err: err}
	}
	return nil
}

// ReadDir lists d.
func (d *Dir) ReadDir() ([]fs.DirEntry, error) {
	sub, err := d.Sub(".")
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	return sub.f.ReadDir(-1)
}

// Sync flushes the directory (its entries) to disk.
func (d *Dir) Sync() error {
	if err := d.f.Sync(); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}

func (d *Dir) checkBase(name string) error {
	if err := d.checkName(name); err != nil {
		return err
	}
	if strings.Contains(name, "/") || name == "." {
		return d.unsafeErr(name, "not a single name")
	}
	return nil
}
