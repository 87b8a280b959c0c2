package envd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	rpc "github.com/cryo-runtime/cryo/agent/envd/spec/filesystem"
	"github.com/cryo-runtime/cryo/agent/envd/spec/filesystem/filesystemconnect"
)

// Every path below is a path of the container, opened under its root with
// openInRoot (RESOLVE_IN_ROOT): a symlink or ".." the container made never
// leads to the agent's own files. Where a path walk could race with the
// container (create, remove, rename, chown), the parent is opened in the
// root and the last component handled with an *at call that does not follow
// it.

// New files and directories get these modes, as E2B's envd gives them under
// the usual umask; the agent's own umask is not the container's.
const (
	newFileMode = 0o644
	newDirMode  = 0o755
)

// filesystemService is filesystem.Filesystem for the Server's container.
type filesystemService struct {
	s *Server

	// Bounds of the polled watchers, from maxWatchers and maxQueuedEvents.
	maxWatchers, maxQueued int

	mu       sync.Mutex
	watchers map[string]*polledWatch
}

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

func newFilesystemService(s *Server) *filesystemService {
	return &filesystemService{
		s:           s,
		maxWatchers: maxWatchers,
		maxQueued:   maxQueuedEvents,
		watchers:    map[string]*polledWatch{},
	}
}

// fsRequest is what every files operation starts from: the container's
// root, the user the request acts as, and names of owners for EntryInfo.
type fsRequest struct {
	root     string
	user     User
	workdir  string
	accounts *accountNames
}

// fsRequestFor resolves the user a request names (the SDK's Basic auth for
// the RPCs, ?username= for /files), else /init's default user, else the
// container's own process user.
func (s *Server) fsRequestFor(named string) (*fsRequest, error) {
	root, err := s.container.Root()
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("container root: %w", err))
	}
	s.mu.Lock()
	name, workdir := s.user, s.workdir
	s.mu.Unlock()
	if named != "" {
		name = named
	}
	if name == "" {
		name = strconv.FormatUint(uint64(s.container.Process().UID), 10)
	}
	u, err := lookupUser(root, name)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	return &fsRequest{root: root, user: u, workdir: workdir, accounts: &accountNames{root: root}}, nil
}

// rpcRequest is fsRequestFor the user of a Connect request's Basic auth.
func (s *Server) rpcRequest(h http.Header) (*fsRequest, error) {
	name, _, err := requestUser(&http.Request{Header: h})
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	return s.fsRequestFor(name)
}

// path makes p absolute in the container as E2B's envd does: "~" is the
// user's home, a relative path is under the home, an empty one is /init's
// default workdir (else the home).
func (r *fsRequest) path(p string) (string, error) {
	if p == "" {
		p = r.workdir
		if p == "" {
			p = r.user.Home
		}
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q has a NUL byte", p))
	}
	switch {
	case p == "~" || strings.HasPrefix(p, "~/"):
		p = path.Join(r.user.Home, p[1:])
	case strings.HasPrefix(p, "~"):
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q: cannot expand another user's home", p))
	case !path.IsAbs(p):
		p = path.Join(r.user.Home, p)
	}
	return path.Clean(p), nil
}

// open opens p of the container, symlinks resolved inside its root.
func (r *fsRequest) open(p string, flags int, mode uint32) (*os.File, error) {
	return openInRoot(r.root, p, flags, mode)
}

// openParent opens the directory that holds p (O_PATH) and returns it with
// p's last component, for the *at calls that must not follow it.
func (r *fsRequest) openParent(p string) (*os.File, string, error) {
	if p == "/" {
		d, err := r.open("/", unix.O_PATH|unix.O_DIRECTORY, 0)
		return d, ".", err
	}
	d, err := r.open(path.Dir(p), unix.O_PATH|unix.O_DIRECTORY, 0)
	return d, path.Base(p), err
}

// ensureDirs creates p and its missing parents, each owned by the user, as
// E2B's envd does before a write, a move or MakeDir.
func (r *fsRequest) ensureDirs(p string) error {
	cur := "/"
	for _, c := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		if c == "" {
			continue
		}
		parent, err := r.open(cur, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(int(parent.Fd()), c, newDirMode)
		if err == nil {
			err = unix.Fchownat(int(parent.Fd()), c, int(r.user.UID), int(r.user.GID), unix.AT_SYMLINK_NOFOLLOW)
		} else if errors.Is(err, unix.EEXIST) {
			err = nil
		}
		parent.Close()
		cur = path.Join(cur, c)
		if err != nil {
			return &os.PathError{Op: "mkdir", Path: cur, Err: err}
		}
	}
	d, err := r.open(p, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	return d.Close()
}

// accountNames maps uids and gids to the container's own names, read once
// per request from its /etc/passwd and /etc/group.
type accountNames struct {
	root          string
	loaded        bool
	users, groups map[uint32]string
}

func (a *accountNames) load() {
	if a.loaded {
		return
	}
	a.loaded = true
	a.users, a.groups = map[uint32]string{}, map[uint32]string{}
	for file, m := range map[string]map[uint32]string{"/etc/passwd": a.users, "/etc/group": a.groups} {
		_ = eachLine(a.root, file, func(f []string) bool {
			if len(f) >= 3 {
				if id, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					if _, dup := m[uint32(id)]; !dup {
						m[uint32(id)] = f[0]
					}
				}
			}
			return true
		})
	}
}

// owner and group are the names E2B's envd shows: the name if the
// container has one, else the number.
func (a *accountNames) owner(uid uint32) string {
	a.load()
	if n, ok := a.users[uid]; ok {
		return n
	}
	return strconv.FormatUint(uint64(uid), 10)
}

func (a *accountNames) group(gid uint32) string {
	a.load()
	if n, ok := a.groups[gid]; ok {
		return n
	}
	return strconv.FormatUint(uint64(gid), 10)
}

// fileMode converts a stat mode as os.Lstat does, so that Permissions reads
// as Go's (and so E2B's envd's) FileMode.String: "-rw-r--r--", "drwxr-xr-x".
func statMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFBLK:
		mode |= os.ModeDevice
	case unix.S_IFCHR:
		mode |= os.ModeDevice | os.ModeCharDevice
	case unix.S_IFDIR:
		mode |= os.ModeDir
	case unix.S_IFIFO:
		mode |= os.ModeNamedPipe
	case unix.S_IFLNK:
		mode |= os.ModeSymlink
	case unix.S_IFSOCK:
		mode |= os.ModeSocket
	}
	if m&unix.S_ISGID != 0 {
		mode |= os.ModeSetgid
	}
	if m&unix.S_ISUID != 0 {
		mode |= os.ModeSetuid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

func entryType(m os.FileMode) rpc.FileType {
	switch {
	case m.IsRegular():
		return rpc.FileType_FILE_TYPE_FILE
	case m.IsDir():
		return rpc.FileType_FILE_TYPE_DIRECTORY
	case m&os.ModeSymlink != 0:
		return rpc.FileType_FILE_TYPE_SYMLINK
	}
	return rpc.FileType_FILE_TYPE_UNSPECIFIED
}

// entryAt describes name in the directory dirfd, whose container path is
// p, without following it. As E2B's envd, a symlink has its target's type
// and permission bits, its own Permissions string and the target's path.
func (r *fsRequest) entryAt(dirfd int, name, p string) (*rpc.EntryInfo, os.FileMode, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, 0, &os.PathError{Op: "stat", Path: p, Err: err}
	}
	mode := statMode(st.Mode)
	e := &rpc.EntryInfo{
		Name:         path.Base(p),
		Type:         entryType(mode),
		Path:         p,
		Size:         st.Size,
		Mode:         uint32(mode.Perm()),
		Permissions:  mode.String(),
		Owner:        r.accounts.owner(st.Uid),
		Group:        r.accounts.group(st.Gid),
		ModifiedTime: timestamppb.New(time.Unix(st.Mtim.Unix())),
	}
	if mode&os.ModeSymlink != 0 {
		target := r.resolve(p)
		e.SymlinkTarget = &target
		e.Type, e.Mode = rpc.FileType_FILE_TYPE_UNSPECIFIED, 0
		if f, err := r.open(p, unix.O_PATH, 0); err == nil {
			var tst unix.Stat_t
			if unix.Fstat(int(f.Fd()), &tst) == nil {
				tm := statMode(tst.Mode)
				e.Type, e.Mode = entryType(tm), uint32(tm.Perm())
			}
			f.Close()
		}
	}
	return e, mode, nil
}

// entry describes p without following its last component.
func (r *fsRequest) entry(p string) (*rpc.EntryInfo, os.FileMode, error) {
	d, name, err := r.openParent(p)
	if err != nil {
		return nil, 0, err
	}
	defer d.Close()
	return r.entryAt(int(d.Fd()), name, p)
}

// resolve is p with every symlink resolved as the container sees it (its
// root is "/"); where that fails, or leads to nothing (a dangling link),
// p itself, as E2B's envd (filepath.EvalSymlinks) answers. It is for
// showing only: every access goes through openInRoot again.
func (r *fsRequest) resolve(p string) string {
	fs := containerFS{r}
	resolved, err := securejoin.SecureJoinVFS("/", p, fs)
	if err != nil {
		return p
	}
	if _, err := fs.Lstat(resolved); err != nil {
		return p
	}
	return resolved
}

// containerFS is the container's filesystem as securejoin walks it: each
// component's parent is opened inside the container's root (openInRoot),
// so a symlink the walk has not reached yet cannot lead it out.
type containerFS struct{ r *fsRequest }

func (c containerFS) Lstat(p string) (os.FileInfo, error) {
	d, name, err := c.r.openParent(p)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return os.Lstat(fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), name))
}

func (c containerFS) Readlink(p string) (string, error) {
	d, name, err := c.r.openParent(p)
	if err != nil {
		return "", err
	}
	defer d.Close()
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(int(d.Fd()), name, buf)
	if err != nil {
		return "", &os.PathError{Op: "readlink", Path: p, Err: err}
	}
	return string(buf[:n]), nil
}

// fsError converts an error of a files operation to the Connect code E2B's
// SDK maps to its own errors (NotFound to FileNotFoundError, ...). A full
// disk is Internal, as E2B's envd answers it: the SDK would take
// ResourceExhausted for a rate limit ("please try again later").
func fsError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return connect.NewError(connect.CodeInternal, err)
	}
	switch errno {
	case unix.ENOENT:
		return connect.NewError(connect.CodeNotFound, err)
	case unix.EEXIST, unix.ENOTEMPTY:
		return connect.NewError(connect.CodeAlreadyExists, err)
	case unix.EACCES, unix.EPERM, unix.EROFS:
		return connect.NewError(connect.CodePermissionDenied, err)
	case unix.ENOTDIR, unix.EISDIR, unix.EINVAL, unix.ELOOP, unix.EXDEV, unix.ENAMETOOLONG:
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// Stat describes a path without following its last component.
func (fs *filesystemService) Stat(ctx context.Context, req *connect.Request[rpc.StatRequest]) (*connect.Response[rpc.StatResponse], error) {
	r, p, err := fs.begin(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, _, err := r.entry(p)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&rpc.StatResponse{Entry: e}), nil
}

// begin resolves a request's user and its path.
func (fs *filesystemService) begin(h http.Header, p string) (*fsRequest, string, error) {
	r, err := fs.s.rpcRequest(h)
	if err != nil {
		return nil, "", err
	}
	p, err = r.path(p)
	return r, p, err
}

// MakeDir creates a directory and its parents, owned by the user;
// AlreadyExists when it is there, as E2B's envd answers.
func (fs *filesystemService) MakeDir(ctx context.Context, req *connect.Request[rpc.MakeDirRequest]) (*connect.Response[rpc.MakeDirResponse], error) {
	r, p, err := fs.begin(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if f, err := r.open(p, unix.O_PATH, 0); err == nil {
		var st unix.Stat_t
		err = unix.Fstat(int(f.Fd()), &st)
		f.Close()
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory already exists: %s", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path already exists but it is not a directory: %s", p))
	}
	if err := r.ensureDirs(p); err != nil {
		return nil, fsError(err)
	}
	e, _, err := r.entry(p)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&rpc.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, creating the destination's parents.
func (fs *filesystemService) Move(ctx context.Context, req *connect.Request[rpc.MoveRequest]) (*connect.Response[rpc.MoveResponse], error) {
	r, src, err := fs.begin(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := r.path(req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if src == "/" || dst == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("cannot move the root directory"))
	}
	if err := r.ensureDirs(path.Dir(dst)); err != nil {
		return nil, fsError(err)
	}
	if err := r.rename(src, dst); err != nil {
		return nil, fsError(err)
	}
	e, _, err := r.entry(dst)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&rpc.MoveResponse{Entry: e}), nil
}

func (r *fsRequest) rename(src, dst string) error {
	sd, sname, err := r.openParent(src)
	if err != nil {
		return err
	}
	defer sd.Close()
	dd, dname, err := r.openParent(dst)
	if err != nil {
		return err
	}
	defer dd.Close()
	if err := unix.Renameat(int(sd.Fd()), sname, int(dd.Fd()), dname); err != nil {
		return &os.LinkError{Op: "rename", Old: src, New: dst, Err: err}
	}
	return nil
}

// ListDir lists a directory (following it if it is a symlink) down to
// depth levels (0 means 1), in the order of a lexical pre-order walk, as
// E2B's envd; symlinked directories inside are listed, not entered.
func (fs *filesystemService) ListDir(ctx context.Context, req *connect.Request[rpc.ListDirRequest]) (*connect.Response[rpc.ListDirResponse], error) {
	r, p, err := fs.begin(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	d, err := r.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path is not a directory: %s", p))
		}
		return nil, fsError(err)
	}
	var entries []*rpc.EntryInfo
	err = r.walk(ctx, d, p, depth, &entries)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&rpc.ListDirResponse{Entries: entries}), nil
}

// walk appends dir's entries to out and descends depth-1 more levels
// through openat(O_NOFOLLOW), so a directory swapped for a symlink
// mid-walk is not entered. It closes dir.
func (r *fsRequest) walk(ctx context.Context, dir *os.File, p string, depth int, out *[]*rpc.EntryInfo) error {
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		child := path.Join(p, name)
		e, mode, err := r.entryAt(int(dir.Fd()), name, child)
		if errors.Is(err, unix.ENOENT) {
			continue // removed since it was listed
		}
		if err != nil {
			return err
		}
		*out = append(*out, e)
		if depth <= 1 || !mode.IsDir() {
			continue
		}
		fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				continue
			}
			return &os.PathError{Op: "open", Path: child, Err: err}
		}
		if err := r.walk(ctx, os.NewFile(uintptr(fd), child), child, depth-1, out); err != nil {
			return err
		}
	}
	return nil
}

// Remove removes a path and, for a directory, everything under it; a path
// that is not there is no error, as E2B's envd (os.RemoveAll).
func (fs *filesystemService) Remove(ctx context.Context, req *connect.Request[rpc.RemoveRequest]) (*connect.Response[rpc.RemoveResponse], error) {
	r, p, err := fs.begin(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("cannot remove the root directory"))
	}
	d, name, err := r.openParent(p)
	if errors.Is(err, unix.ENOENT) {
		return connect.NewResponse(&rpc.RemoveResponse{}), nil
	}
	if err != nil {
		return nil, fsError(err)
	}
	defer d.Close()
	if err := removeAt(int(d.Fd()), name); err != nil {
		return nil, fsError(&os.PathError{Op: "remove", Path: p, Err: err})
	}
	return connect.NewResponse(&rpc.RemoveResponse{}), nil
}

// removeAt removes name in dirfd and all under it, never following a
// symlink: each directory is entered through openat(O_NOFOLLOW).
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, oerr := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if oerr != nil {
		if errors.Is(oerr, unix.ENOENT) {
			return nil
		}
		return err
	}
	dir := os.NewFile(uintptr(fd), name)
	defer dir.Close()
	// Entries the container adds meanwhile make the last unlink fail with
	// ENOTEMPTY: list again, a few times.
	for try := 0; ; try++ {
		names, err := dir.Readdirnames(-1)
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := removeAt(fd, n); err != nil {
				return err
			}
		}
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.ENOTEMPTY) || try == 3 {
			return err
		}
		if _, err := dir.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
}
