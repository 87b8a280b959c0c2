package envd

// Watches use inotify through golang.org/x/sys/unix rather than
// github.com/fsnotify/fsnotify: a watch must be added on a directory opened
// inside the container's root (openInRoot, then /proc/self/fd/N), never by
// a path the agent would resolve itself, and recursive watches need the
// watch descriptor to directory map, which fsnotify keeps to itself and
// keys by path.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"connectrpc.com/connect"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	rpc "github.com/cryo-runtime/cryo/agent/envd/spec/filesystem"
)

const (
	// watchMask is what inotify watches, whose events E2B's envd reports.
	watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
		unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
)

// maxWatchers bounds the polled watchers (CreateWatcher) alive at once:
// each holds an inotify instance and its queue until RemoveWatcher. A
// variable for tests.
var maxWatchers = 64

// maxQueuedEvents bounds a polled watcher's queue between two
// GetWatcherEvents; past it the watcher stops with an error rather than
// lose events silently. A variable for tests.
var maxQueuedEvents = 10000

// errOverflow ends a watch whose events the kernel or the queue dropped.
var errOverflow = errors.New("too many filesystem events: some were dropped")

// dirWatch is an inotify watch of a directory of the container, and of its
// subdirectories when recursive.
type dirWatch struct {
	req       *fsRequest
	dir       string // the watched directory, a container path
	recursive bool
	entries   bool // include the entry's info in events

	fd   int      // the inotify instance
	file *os.File // fd in Go's poller, so that Close ends a blocked Read

	mu  sync.Mutex
	wds map[int]string // watch descriptor -> directory relative to dir ("" for dir)
}

func newDirWatch(r *fsRequest, dir string, recursive, entries bool) (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &dirWatch{
		req: r, dir: dir, recursive: recursive, entries: entries,
		fd: fd, file: os.NewFile(uintptr(fd), "inotify"),
		wds: map[int]string{},
	}
	if err := w.add(""); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// Close ends the watch and a run blocked reading it.
func (w *dirWatch) Close() error { return w.file.Close() }

// add watches dir/rel and, when recursive, the directories under it. The
// kernel resolves /proc/self/fd/N to the directory openInRoot found, so no
// symlink is followed outside the container's root.
func (w *dirWatch) add(rel string) error {
	p := path.Join(w.dir, rel)
	d, err := w.req.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	wd, err := unix.InotifyAddWatch(w.fd, "/proc/self/fd/"+strconv.Itoa(int(d.Fd())), watchMask)
	if err != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: p, Err: err}
	}
	w.mu.Lock()
	w.wds[wd] = rel
	w.mu.Unlock()
	if !w.recursive {
		return nil
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return &os.PathError{Op: "readdir", Path: p, Err: err}
	}
	for _, name := range names {
		var st unix.Stat_t
		if unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		if err := w.add(path.Join(rel, name)); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}

// run reads events until Close or an overflow, and hands each to emit
// (until emit returns false). Names are relative to the watched directory.
func (w *dirWatch) run(emit func(*rpc.FilesystemEvent) bool) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read inotify: %w", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameEnd := off + unix.SizeofInotifyEvent + int(ev.Len)
			if nameEnd > n {
				break
			}
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:nameEnd]), "\x00")
			off = nameEnd
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				return errOverflow
			}
			for _, e := range w.events(int(ev.Wd), ev.Mask, name) {
				if !emit(e) {
					return nil
				}
			}
		}
	}
}

// events converts one inotify event, in the order E2B's envd lists an
// fsnotify event's operations.
func (w *dirWatch) events(wd int, mask uint32, name string) []*rpc.FilesystemEvent {
	w.mu.Lock()
	rel, ok := w.wds[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.wds, wd)
	}
	w.mu.Unlock()
	// A directory's own removal or rename is reported by its parent's
	// watch, except for the watched directory's, which has none.
	if !ok || name == "" && (rel != "" || mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) == 0) {
		return nil
	}
	rel = path.Join(rel, name)
	if rel == "" {
		rel = "."
	}
	if w.recursive && mask&unix.IN_ISDIR != 0 {
		switch {
		case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
			if err := w.add(rel); err != nil && !errors.Is(err, unix.ENOENT) {
				log.L.WithError(err).Warn("envd: watch a new directory")
			}
		case mask&unix.IN_MOVED_FROM != 0:
			w.forget(rel)
		}
	}
	var types []rpc.EventType
	if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		types = append(types, rpc.EventType_EVENT_TYPE_CREATE)
	}
	if mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0 {
		types = append(types, rpc.EventType_EVENT_TYPE_RENAME)
	}
	if mask&unix.IN_ATTRIB != 0 {
		types = append(types, rpc.EventType_EVENT_TYPE_CHMOD)
	}
	if mask&unix.IN_MODIFY != 0 {
		types = append(types, rpc.EventType_EVENT_TYPE_WRITE)
	}
	if mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0 {
		types = append(types, rpc.EventType_EVENT_TYPE_REMOVE)
	}
	out := make([]*rpc.FilesystemEvent, 0, len(types))
	for _, t := range types {
		e := &rpc.FilesystemEvent{Name: rel, Type: t}
		if w.entries && t != rpc.EventType_EVENT_TYPE_REMOVE && t != rpc.EventType_EVENT_TYPE_RENAME {
			e.Entry, _, _ = w.req.entry(path.Join(w.dir, rel))
		}
		out = append(out, e)
	}
	return out
}

// forget stops watching a directory moved away and those under it: their
// events would carry names it no longer has (or is moved out of the tree);
// moved back in, it is watched again under its new name.
func (w *dirWatch) forget(rel string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for wd, r := range w.wds {
		if r == rel || strings.HasPrefix(r, rel+"/") {
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
			delete(w.wds, wd)
		}
	}
}

// watch starts a watch of the directory a request names.
func (fs *filesystemService) watch(h http.Header, p string, recursive, entries bool) (*dirWatch, error) {
	r, p, err := fs.begin(h, p)
	if err != nil {
		return nil, err
	}
	d, err := r.open(p, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s not a directory", p))
		}
		return nil, fsError(err)
	}
	d.Close()
	w, err := newDirWatch(r, p, recursive, entries)
	if err != nil {
		return nil, fsError(err)
	}
	return w, nil
}

// WatchDir streams a directory's events: a start event once the watch is
// in place, then each event, with keepalives while there is none.
func (fs *filesystemService) WatchDir(ctx context.Context, req *connect.Request[rpc.WatchDirRequest], stream *connect.ServerStream[rpc.WatchDirResponse]) error {
	w, err := fs.watch(req.Header(), req.Msg.GetPath(), req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	if err := stream.Send(&rpc.WatchDirResponse{Event: &rpc.WatchDirResponse_Start{Start: &rpc.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	events := make(chan *rpc.FilesystemEvent, 256)
	done := make(chan error, 1)
	go func() {
		done <- w.run(func(e *rpc.FilesystemEvent) bool {
			select {
			case events <- e:
				return true
			case <-ctx.Done():
				return false
			}
		})
	}()
	interval := keepalive(req.Header())
	keepalive := time.NewTicker(interval)
	defer keepalive.Stop()
	for {
		var msg *rpc.WatchDirResponse
		select {
		case <-ctx.Done():
			return nil
		case err := <-done:
			return watchError(err)
		case e := <-events:
			msg = &rpc.WatchDirResponse{Event: &rpc.WatchDirResponse_Filesystem{Filesystem: e}}
			keepalive.Reset(interval)
		case <-keepalive.C:
			msg = &rpc.WatchDirResponse{Event: &rpc.WatchDirResponse_Keepalive{Keepalive: &rpc.WatchDirResponse_KeepAlive{}}}
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
	}
}

// watchError is Internal for an overflow too, as E2B's envd answers a
// watcher's error: the SDK would take ResourceExhausted for a rate limit.
func watchError(err error) error {
	if err == nil {
		return connect.NewError(connect.CodeAborted, errors.New("watch ended"))
	}
	return connect.NewError(connect.CodeInternal, err)
}

// polledWatch is a watch whose events wait in a bounded queue for
// GetWatcherEvents.
type polledWatch struct {
	w   *dirWatch
	max int // events queued at most

	mu     sync.Mutex
	events []*rpc.FilesystemEvent
	err    error // why the watch stopped, told once the queue is drained
}

func (pw *polledWatch) run() {
	err := pw.w.run(func(e *rpc.FilesystemEvent) bool {
		pw.mu.Lock()
		defer pw.mu.Unlock()
		if len(pw.events) >= pw.max {
			return false
		}
		pw.events = append(pw.events, e)
		return true
	})
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if err == nil && len(pw.events) >= pw.max {
		err = fmt.Errorf("%w: more than %d events since the last GetWatcherEvents", errOverflow, pw.max)
	}
	pw.err = err
	pw.w.Close()
}

// take empties the queue; once it is empty, a stopped watch says why.
func (pw *polledWatch) take() ([]*rpc.FilesystemEvent, error) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	events := pw.events
	pw.events = nil
	if len(events) == 0 && pw.err != nil {
		return nil, watchError(pw.err)
	}
	return events, nil
}

// CreateWatcher starts a watch polled by GetWatcherEvents until
// RemoveWatcher.
func (fs *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[rpc.CreateWatcherRequest]) (*connect.Response[rpc.CreateWatcherResponse], error) {
	fs.mu.Lock()
	n := len(fs.watchers)
	fs.mu.Unlock()
	if n >= fs.maxWatchers {
		return nil, fs.tooManyWatchers()
	}
	w, err := fs.watch(req.Header(), req.Msg.GetPath(), req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, err
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	pw := &polledWatch{w: w, max: fs.maxQueued}
	fs.mu.Lock()
	if len(fs.watchers) >= fs.maxWatchers {
		fs.mu.Unlock()
		w.Close()
		return nil, fs.tooManyWatchers()
	}
	fs.watchers[hex.EncodeToString(id)] = pw
	fs.mu.Unlock()
	go pw.run()
	return connect.NewResponse(&rpc.CreateWatcherResponse{WatcherId: hex.EncodeToString(id)}), nil
}

// tooManyWatchers is Internal: E2B's envd has no such bound, and the SDK
// would take ResourceExhausted for a rate limit ("please try again later")
// where removing a watcher is what helps.
func (fs *filesystemService) tooManyWatchers() error {
	return connect.NewError(connect.CodeInternal, fmt.Errorf("%d watchers already: remove one first", fs.maxWatchers))
}

func (fs *filesystemService) watcher(id string) (*polledWatch, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	pw, ok := fs.watchers[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	return pw, nil
}

// GetWatcherEvents returns the events since the last call.
func (fs *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[rpc.GetWatcherEventsRequest]) (*connect.Response[rpc.GetWatcherEventsResponse], error) {
	pw, err := fs.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	events, err := pw.take()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&rpc.GetWatcherEventsResponse{Events: events}), nil
}

// RemoveWatcher stops a watch and drops its queue.
func (fs *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[rpc.RemoveWatcherRequest]) (*connect.Response[rpc.RemoveWatcherResponse], error) {
	pw, err := fs.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	fs.mu.Lock()
	delete(fs.watchers, req.Msg.GetWatcherId())
	fs.mu.Unlock()
	pw.w.Close()
	return connect.NewResponse(&rpc.RemoveWatcherResponse{}), nil
}
