package pagefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/log"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Options tune a mount. Zero fields take the defaults.
type Options struct {
	// MaxRead caps one READ (and WRITE) request; the kernel's limit is
	// max_pages_limit (256 pages, 1 MiB, by default). Default 1 MiB: one
	// round trip per chunk-sized fault cluster.
	MaxRead int
	// MaxReadAhead caps the kernel's readahead window for the files
	// (default MaxRead).
	MaxReadAhead int
	Debug        bool
	// AllowUIDs may open and change the files besides root (the confined
	// QEMU's uid; Server.Allow adds one once it is known). The mount is
	// allow_other without default_permissions: pagefs itself refuses every
	// other caller with EACCES.
	AllowUIDs []uint32
}

// Server is a mounted pagefs.
type Server struct {
	dir  string
	srv  *fuse.Server
	conn uint32 // fusectl connection number (the mount's minor device)
	acc  *access
}

// access is the set of uids, besides root, that may open the files.
type access struct {
	mu   sync.RWMutex
	uids map[uint32]bool
}

// admits reports whether the request's caller may open or change a file:
// root and the allowed uids. A request without a caller is refused.
func (a *access) admits(ctx context.Context) bool {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return false
	}
	if c.Uid == 0 {
		return true
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.uids[c.Uid]
}

// Allow lets uid open and change the served files (QEMU's uid, once it is
// leased).
func (s *Server) Allow(uid uint32) {
	s.acc.mu.Lock()
	s.acc.uids[uid] = true
	s.acc.mu.Unlock()
}

// Mount serves files in dir (an existing empty directory) until Unmount.
// It mounts with mount(2) directly (no fusermount: the shim runs as root)
// and allow_other, so a confined QEMU of another uid may open the files;
// only root and o.AllowUIDs (and Allow's) may.
func Mount(dir string, files []*File, o Options) (*Server, error) {
	if o.MaxRead == 0 {
		o.MaxRead = 1 << 20
	}
	if o.MaxReadAhead == 0 {
		o.MaxReadAhead = o.MaxRead
	}
	acc := &access{uids: map[uint32]bool{}}
	for _, u := range o.AllowUIDs {
		acc.uids[u] = true
	}
	r := &root{files: files, acc: acc}
	long := time.Hour // sizes never change while mounted
	srv, err := fs.Mount(dir, r, &fs.Options{
		EntryTimeout: &long, AttrTimeout: &long,
		MountOptions: fuse.MountOptions{
			AllowOther: true, DirectMountStrict: true,
			FsName: "cryo-pagefs", Name: "cryo-pagefs",
			MaxWrite: o.MaxRead, MaxReadAhead: o.MaxReadAhead,
			DisableXAttrs: true, Debug: o.Debug,
			// A 1 MiB read does not fit the 1 MiB pipe splice needs (with
			// its header); the data is in a buffer anyway.
			DisableSplice: true,
			// QEMU's faults come from many vCPU threads; let them overlap.
			MaxBackground: 64,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("mount pagefs on %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		srv.Unmount()
		return nil, fmt.Errorf("stat pagefs mount %s: %w", dir, err)
	}
	return &Server{dir: dir, srv: srv, conn: unix.Minor(st.Dev), acc: acc}, nil
}

// Path is the mounted path of the file called name.
func (s *Server) Path(name string) string { return filepath.Join(s.dir, name) }

// Unmount unmounts, lazily if the files are still mapped: a mapping keeps
// the connection, and its faults then fail (SIGBUS) once the server is
// gone.
func (s *Server) Unmount() error {
	if err := s.srv.Unmount(); err != nil {
		if err := unix.Unmount(s.dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount pagefs %s: %w", s.dir, err)
		}
	}
	return nil
}

// Abort ends the connection as the kernel does when the server dies: every
// pending and later request fails with ENOTCONN (a fault on a mapped page
// not yet in the page cache raises SIGBUS). The fusectl filesystem must be
// mounted on /sys/fs/fuse/connections.
func (s *Server) Abort() error { return AbortConnection(s.conn) }

// AbortConnection is Abort for fuse connection conn (its fusectl number,
// the mount's minor device), whose server may be gone: a killed shim's.
func AbortConnection(conn uint32) error {
	p := filepath.Join(FusectlDir, strconv.FormatUint(uint64(conn), 10), "abort")
	return os.WriteFile(p, []byte("1"), 0)
}

type root struct {
	fs.Inode
	files []*File
	acc   *access
}

var _ fs.NodeOnAdder = (*root)(nil)

func (r *root) OnAdd(ctx context.Context) {
	for _, f := range r.files {
		ch := r.NewPersistentInode(ctx, &node{f: f, acc: r.acc}, fs.StableAttr{Mode: syscall.S_IFREG})
		r.AddChild(f.name, ch, false)
	}
}

type node struct {
	fs.Inode
	f   *File
	acc *access
}

var (
	_ fs.NodeOpener    = (*node)(nil)
	_ fs.NodeGetattrer = (*node)(nil)
	_ fs.NodeSetattrer = (*node)(nil)
	_ fs.NodeReader    = (*node)(nil)
	_ fs.NodeWriter    = (*node)(nil)
	_ fs.NodeFsyncer   = (*node)(nil)
	_ fs.NodeFlusher   = (*node)(nil)
	_ fs.NodeAllocater = (*node)(nil)
	_ fs.NodeReleaser  = (*node)(nil)
	_ fs.NodeStatfser  = (*root)(nil)
	_ fs.NodeGetattrer = (*root)(nil)
)

func (r *root) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno { return 0 }

func (r *root) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o755
	return 0
}

// Open keeps the page cache across opens (FOPEN_KEEP_CACHE): the content
// of a served file never changes behind the kernel's back, and clones of
// one snapshot share the cached pages. Only root and the allowed uids
// may open a file (the guest's RAM).
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if !n.acc.admits(ctx) {
		return nil, 0, syscall.EACCES
	}
	return nil, fuse.FOPEN_KEEP_CACHE, 0
}

func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o600
	if n.f.layer == nil {
		out.Mode = syscall.S_IFREG | 0o400
	}
	out.Size = uint64(n.f.size)
	out.Blocks = (out.Size + 511) / 512
	out.Blksize = PageSize
	out.Nlink = 1
	return 0
}

// Setattr refuses size changes: QEMU truncates a memory-backend-file only
// when its size differs from the guest's RAM, which would be a wrong file.
func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if !n.acc.admits(ctx) {
		return syscall.EACCES
	}
	if sz, ok := in.GetSize(); ok && int64(sz) != n.f.size {
		return syscall.EPERM
	}
	return n.Getattr(ctx, fh, out)
}

func (n *node) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	c, err := n.f.ReadAt(dest, off)
	if err != nil && c == 0 && off >= n.f.size {
		return fuse.ReadResultData(nil), 0
	}
	if err != nil {
		// Never a short or zero-filled answer: the fault fails (SIGBUS in
		// QEMU) rather than the guest seeing wrong bytes.
		log.L.WithError(err).WithFields(log.Fields{"file": n.f.name, "offset": off, "size": len(dest)}).Error("pagefs read")
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:c]), 0
}

func (n *node) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	c, err := n.f.WriteAt(data, off)
	switch {
	case errors.Is(err, errReadOnly):
		return 0, syscall.EROFS
	case errors.Is(err, errOutOfRange):
		return 0, syscall.EFBIG
	case err != nil:
		log.L.WithError(err).WithField("file", n.f.name).Error("pagefs write")
		return uint32(c), syscall.EIO
	}
	return uint32(c), 0
}

// Fsync has nothing to do: a written page is in the layer (the dirty set)
// as soon as Write returns, and the layer need not survive a host crash.
func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno { return 0 }

// Flush answers ENOSYS, so the kernel stops sending FLUSH on the first
// close: a close (QEMU's at exit) then never waits on the server, which a
// hung server would make wait for ever (FLUSH is not interruptible).
func (n *node) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno { return syscall.ENOSYS }

func (n *node) Release(ctx context.Context, fh fs.FileHandle) syscall.Errno { return 0 }

// Allocate accepts what does not change content (QEMU may preallocate).
func (n *node) Allocate(ctx context.Context, fh fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	if !n.acc.admits(ctx) {
		return syscall.EACCES
	}
	if mode&^uint32(unix.FALLOC_FL_KEEP_SIZE) != 0 || off+size > uint64(n.f.size) {
		return syscall.EOPNOTSUPP
	}
	return 0
}

// FusectlDir is where the fuse control filesystem lives (Abort): a
// directory per connection, with its abort and waiting files.
const FusectlDir = "/sys/fs/fuse/connections"

// EnsureFusectl mounts the fuse control filesystem if it is not mounted:
// Abort needs it, and a server stuck on a request is only ended by an
// abort. It is left mounted (it is the kernel's, shared by every mount).
func EnsureFusectl() error {
	var st, parent unix.Stat_t
	if err := unix.Stat(FusectlDir, &st); err != nil {
		return fmt.Errorf("fusectl: %w", err)
	}
	if err := unix.Stat(filepath.Dir(FusectlDir), &parent); err != nil {
		return fmt.Errorf("fusectl: %w", err)
	}
	if st.Dev != parent.Dev {
		return nil // something is mounted there: fusectl
	}
	if err := unix.Mount("fusectl", FusectlDir, "fusectl", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mount fusectl on %s: %w", FusectlDir, err)
	}
	return nil
}

// TuneWriteback lifts the FUSE bdi's default writeback limits for the
// mount (strict_limit=1, max_ratio=1: the kernel writes a share=on guest's
// RAM back continuously, twice as slow for a rewriting guest, DESIGN.md):
// strict_limit=0 and max_bytes. It needs kernel 6.2 or later.
func (s *Server) TuneWriteback(maxBytes int64) error {
	dir := fmt.Sprintf("/sys/class/bdi/0:%d", s.conn)
	for _, kv := range [][2]string{{"strict_limit", "0"}, {"max_bytes", strconv.FormatInt(maxBytes, 10)}} {
		if err := os.WriteFile(filepath.Join(dir, kv[0]), []byte(kv[1]), 0); err != nil {
			return fmt.Errorf("pagefs writeback %s=%s: %w", kv[0], kv[1], err)
		}
	}
	return nil
}
