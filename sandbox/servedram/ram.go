// Package servedram is a lazily restored sandbox's guest RAM (and base
// disks): files of a pagefs mount served from a snapshot, page by page on
// demand, RAM layered (the guest's writes land in a root-only sparse layer
// file, never given to QEMU), with a background prefetch into the node
// cache and the parent a checkpoint's RAM is written against (chain.go).
// QEMU maps the RAM file shared (vmm.MemoryServed).
package servedram

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/redact"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/pagefs"
	"github.com/cryo-runtime/cryo/snapshot"
)

// Parent describes the snapshot a served sandbox's RAM came from: a
// checkpoint reuses the chunks the guest did not change.
type Parent struct {
	StoreURL  string
	Manifest  digest.Digest
	ChunkSize int64
	// Chunks are the "ram" file's stored chunks, in offset order.
	Chunks []snapshot.ChunkDesc
	// KeyID and Lineage are the parent's encryption (its metadata's): a
	// checkpoint under a key rotated since does not reuse its chunks.
	KeyID, Lineage string
	// Zero says no snapshot is behind the RAM: every page outside the
	// dirty set is zero (a booted RAM before its first checkpoint).
	Zero bool
}

// RAM is a lazily restored sandbox's guest RAM (and base disks): files of
// a pagefs mount the shim serves from the snapshot.
type RAM struct {
	srv    *pagefs.Server
	file   *pagefs.File
	layer  string
	parent Parent

	layerFile *os.File
	stateDir  string

	readers []*snapshot.FileReader // ram first, then the disks
	blobs   *nodecache.Blobs       // the node cache, for the logs
	store   string                 // redacted store URL, for the logs
	disks   map[string]string      // disk name -> served path

	unpin []func() // the blobs pinned in this process's node cache

	// fsync writes the guest's dirty page cache of the RAM back to the
	// server (syncMounted); nil without a mount (FromFile), where no
	// page cache stands between the writer and the file.
	fsync func() error

	mu sync.Mutex
	// next is the side file PreSync made for the next Seal (unlinked), so
	// that the pause creates nothing; side and gen are the open
	// generation's, until it ends (endGeneration), after the pause.
	next, side *os.File
	gen        *pagefs.Generation
	readErr    error  // the first page read that failed
	onStuck    func() // kills QEMU: a page failed (setKill)

	// interactedCh closes when the sandbox answered its first request:
	// the prefetch starts then (or after prefetchDelay).
	interactedCh chan struct{}
	interactOnce sync.Once

	// order is the snapshot's recorded working set: ram chunks the
	// prefetch fetches first.
	order []int64

	cancel   context.CancelFunc // stops the prefetch
	prefetch sync.WaitGroup
	// prefetchDelay is the longest the prefetch waits for Interacted.
	prefetchDelay time.Duration
	closed        bool
}

// Options say where a RAM is served from and how its reads are bounded.
type Options struct {
	// StoreURL is the snapshot's store (with its reference): the parent
	// of a checkpoint, and the logs (redacted).
	StoreURL string
	// StateDir is the sandbox's state dir: the mount is its "pagefs", the
	// record of the layer (for Cleanup) is in it.
	StateDir string
	// Layer is the RAM layer file to create (root-only, on tmpfs; its
	// base name starts with "cryo-" and ends with ".layer").
	Layer string
	// Disks are the snapshot's disks served read-only beside the RAM.
	Disks []string
	// PageTimeout bounds every page read; one that outlives it by
	// StuckGrace stops the VM (SetKill).
	PageTimeout, StuckGrace time.Duration
	// PrefetchDelay is the longest the prefetch waits for the sandbox's
	// first request (Interacted) before it starts.
	PrefetchDelay time.Duration
}

// Serve mounts the snapshot's "ram" file (layered) and its disks
// (read-only) at <StateDir>/pagefs. On error nothing is left.
func Serve(ctx context.Context, snap *snapshot.Snapshot, o Options) (_ *RAM, retErr error) {
	r := &RAM{store: redact.URL(o.StoreURL), disks: map[string]string{}, stateDir: o.StateDir, interactedCh: make(chan struct{}), prefetchDelay: o.PrefetchDelay}
	defer func() {
		if retErr != nil {
			r.Close(ctx)
		}
	}()
	ram, err := snap.ServeFile(snapshot.FileRAM)
	if err != nil {
		return nil, err
	}
	r.readers = append(r.readers, ram)
	r.parent = NewParent(o.StoreURL, snap, ram)
	r.order = snap.Metadata.WorkingSet // validated against the ram file
	if err := r.layered(ram.Size(), r.source(ram, o.PageTimeout, o.StuckGrace), o); err != nil {
		return nil, err
	}
	files := []*pagefs.File{r.file}
	for _, name := range o.Disks {
		fr, err := snap.ServeFile(snapshot.DiskFile(name))
		if err != nil {
			return nil, err
		}
		r.readers = append(r.readers, fr)
		f := pagefs.NewReadOnly("disk-"+name, r.source(fr, o.PageTimeout, o.StuckGrace))
		files = append(files, f)
	}
	if err := r.mount(ctx, files, o); err != nil {
		return nil, err
	}
	for _, name := range o.Disks {
		r.disks[name] = r.srv.Path("disk-" + name)
	}
	return r, nil
}

// ServeZero mounts a booted sandbox's RAM of size bytes at
// <StateDir>/pagefs: layered over zeros, with no snapshot behind it (no
// store, no prefetch, no parent: a checkpoint writes the pages the guest
// wrote, the rest is zero). The layer, writeback, admission and the kill
// on a failed read are a lazy restore's; o's StoreURL, Disks and
// PrefetchDelay are unused. On error nothing is left.
func ServeZero(ctx context.Context, size int64, o Options) (_ *RAM, retErr error) {
	if size <= 0 || size%pagefs.PageSize != 0 {
		return nil, fmt.Errorf("served ram of %d bytes: want a positive multiple of %d", size, pagefs.PageSize)
	}
	if o.PageTimeout <= 0 || o.StuckGrace <= 0 {
		return nil, fmt.Errorf("served ram: page timeout %s and grace %s must be positive", o.PageTimeout, o.StuckGrace)
	}
	r := &RAM{store: "zero", disks: map[string]string{}, stateDir: o.StateDir, parent: Parent{Zero: true}}
	defer func() {
		if retErr != nil {
			r.Close(ctx)
		}
	}()
	if err := r.layered(size, r.source(zeroReader{size: size}, o.PageTimeout, o.StuckGrace), o); err != nil {
		return nil, err
	}
	if err := r.mount(ctx, []*pagefs.File{r.file}, o); err != nil {
		return nil, err
	}
	return r, nil
}

// layered makes the RAM file over src, its writes in the layer o names
// (recorded in the state dir first, for Cleanup).
func (r *RAM) layered(size int64, src pagefs.Source, o Options) error {
	r.layer = o.Layer
	if err := os.Remove(r.layer); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// Recorded first: a shim that dies leaves it for sandbox.Cleanup.
	if err := os.WriteFile(filepath.Join(o.StateDir, servedRecord), []byte(r.layer), 0o600); err != nil {
		return fmt.Errorf("ram layer: %w", err)
	}
	lf, err := os.OpenFile(r.layer, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("ram layer: %w", err)
	}
	r.layerFile = lf
	if err := lf.Truncate(size); err != nil {
		return fmt.Errorf("ram layer: %w", err)
	}
	r.file, err = pagefs.NewLayered("ram", src, lf)
	return err
}

// mount serves files at <StateDir>/pagefs, the RAM's writeback opened up.
func (r *RAM) mount(ctx context.Context, files []*pagefs.File, o Options) error {
	if err := pagefs.EnsureFusectl(); err != nil {
		return err
	}
	dir := filepath.Join(o.StateDir, "pagefs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("pagefs mount point: %w", err)
	}
	srv, err := pagefs.Mount(dir, files, pagefs.Options{})
	if err != nil {
		os.Remove(dir)
		return err
	}
	r.srv = srv
	r.fsync = r.syncMounted
	// Nothing is written back while the guest runs; a checkpoint's fsync
	// writes what it dirtied (DESIGN.md, Writeback).
	if err := srv.TuneWriteback(min(r.file.Size(), 1<<30)); err != nil {
		log.G(ctx).WithError(err).Warn("served ram: guest RAM writeback stays throttled")
	}
	checkDirtyLimits(ctx, r.file.Size())
	return nil
}

// zeroReader is a booted RAM's content before the guest writes it.
type zeroReader struct{ size int64 }

func (z zeroReader) Size() int64  { return z.size }
func (z zeroReader) Name() string { return "ram" }
func (z zeroReader) ReadAtContext(_ context.Context, p []byte, off int64) (int, error) {
	if off >= z.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), z.size-off))
	clear(p[:n])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// FromFile is a RAM served by a caller's layered file, whose layer is in
// layer's directory, from parent: no mount, no reader, no prefetch. A
// checkpoint chain over it is tested without FUSE.
func FromFile(file *pagefs.File, layer string, parent Parent) *RAM {
	return &RAM{file: file, layer: layer, parent: parent, interactedCh: make(chan struct{})}
}

// NewParent is snapshot snap of storeURL as a parent, whose RAM ram
// serves.
func NewParent(storeURL string, snap *snapshot.Snapshot, ram *snapshot.FileReader) Parent {
	p := Parent{StoreURL: storeURL, Manifest: snap.Descriptor.Digest, ChunkSize: ram.ChunkSize(), Chunks: ram.Chunks()}
	p.KeyID, p.Lineage = sealOf(&snap.Metadata)
	return p
}

// servedRecord, in the state dir, names the RAM layer of a served
// sandbox.
const servedRecord = "pagefs.layer"

// Cleanup removes what a served sandbox whose shim died left in stateDir
// (call it after its QEMU is gone): the pagefs mount (its connection ended
// with the shim) and the RAM layer. Nothing served: no-op.
func Cleanup(stateDir string) error {
	var errs []error
	mnt := filepath.Join(stateDir, "pagefs")
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount %s: %w", mnt, err))
	}
	b, err := os.ReadFile(filepath.Join(stateDir, servedRecord))
	if errors.Is(err, os.ErrNotExist) {
		return errors.Join(errs...)
	}
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	layer := string(b)
	if !filepath.IsAbs(layer) || filepath.Clean(layer) != layer || !strings.HasPrefix(filepath.Base(layer), "cryo-") || !strings.HasSuffix(layer, ".layer") {
		return errors.Join(append(errs, fmt.Errorf("served sandbox record names %q, not a ram layer", layer))...)
	}
	if err := os.Remove(layer); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Admit lets uid (the confined QEMU's) open the served files; the mount
// refuses every other uid but root.
func (r *RAM) Admit(uid int) {
	if uid >= 0 {
		r.srv.Allow(uint32(uid))
	}
}

// Path is the served RAM file QEMU maps.
func (r *RAM) Path() string { return r.srv.Path("ram") }

// Disk is the served path of base disk name.
func (r *RAM) Disk(name string) (string, bool) {
	p, ok := r.disks[name]
	return p, ok
}

// PreSync readies a checkpoint while the guest runs: it writes the
// guest's dirty RAM pages back to the server (into the layer and the
// dirty set) pass after pass until what a pass writes stops shrinking
// (pagefs.File.PreSync), so that the fsync in the pause (Sync) writes
// little, and makes the side file of the next Seal, so that the pause
// creates nothing. A checkpoint that fails after it calls LostGeneration,
// which drops the side file.
func (r *RAM) PreSync() error {
	if r.fsync != nil {
		if _, err := r.file.PreSync(r.fsync, pagefs.PreSyncOptions{}); err != nil {
			return fmt.Errorf("sync served ram: %w", err)
		}
	}
	return r.prepareSeal()
}

// Sync writes back, in the pause, what the guest dirtied since PreSync:
// one fsync, the guest being stopped.
func (r *RAM) Sync() error {
	if r.fsync == nil {
		return nil
	}
	if err := r.fsync(); err != nil {
		return fmt.Errorf("sync served ram: %w", err)
	}
	return nil
}

// syncMounted fsyncs the mounted RAM file. It opens and closes the file
// each time (an open and a release to the server, in the pause too): a
// descriptor of its own mount that the shim kept would, if the shim were
// killed, make its exit wait on a FLUSH that no server answers, and leave
// QEMU hung in writeback instead of the connection aborted.
func (r *RAM) syncMounted() error {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return errors.New("served ram closed")
	}
	f, err := os.OpenFile(r.Path(), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// prepareSeal makes the next Seal's side file, beside the layer, unless a
// failed checkpoint's is still there (empty: it was never sealed).
func (r *RAM) prepareSeal() error {
	r.mu.Lock()
	ready := r.next != nil
	r.mu.Unlock()
	if ready {
		return nil
	}
	side, err := os.CreateTemp(filepath.Dir(r.layer), filepath.Base(r.layer)+".side-")
	if err != nil {
		return fmt.Errorf("served ram side file: %w", err)
	}
	// Unlinked at once: it lives as long as the descriptor, and nothing is
	// left behind whatever happens to the shim.
	os.Remove(side.Name())
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.next != nil {
		side.Close()
		return nil
	}
	r.next = side
	return nil
}

// Seal freezes the RAM's content for a checkpoint (call it after PreSync,
// and Sync with the guest stopped) and starts a new dirty set: it swaps
// the dirty set and takes the side file PreSync made, nothing else. The
// caller ends the generation with Published or LostGeneration.
func (r *RAM) Seal() (*pagefs.Generation, error) {
	r.mu.Lock()
	side := r.next
	r.mu.Unlock()
	if side == nil {
		return nil, errors.New("seal served ram: no side file (PreSync readies the seal)")
	}
	// Not under r.mu: a write the server is answering holds the file's
	// lock and may read the source, which takes r.mu. A refusal keeps the
	// side file for LostGeneration to drop.
	g, err := r.file.Seal(side)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.gen, r.side, r.next = g, side, nil
	r.mu.Unlock()
	return g, nil
}

// endGeneration ends g, kept in a published snapshot or abandoned (its
// pages dirty again), and drops its side file: the pages the guest wrote
// during the checkpoint are freed here, after the pause.
func (r *RAM) endGeneration(g *pagefs.Generation, kept bool) {
	if kept {
		g.Close()
	} else {
		g.Abandon()
	}
	r.mu.Lock()
	var side *os.File
	if r.gen == g {
		side, r.side, r.gen = r.side, nil, nil
	}
	r.mu.Unlock()
	if side != nil {
		side.Close()
	}
}

// FetchedFields describe what the sandbox read so far: the FUSE reads of
// its RAM and the chunks its readers decoded.
func (r *RAM) FetchedFields() log.Fields {
	var chunks, stored int64
	for _, fr := range r.readers {
		c, b := fr.Fetched()
		chunks, stored = chunks+c, stored+b
	}
	f := log.Fields{"ram_read_bytes": r.file.Stats().ReadBytes, "chunks_fetched": chunks, "chunk_bytes_fetched": stored}
	if r.blobs != nil {
		f["cache_downloaded_bytes"] = r.blobs.Stats().BytesDownloaded
	}
	return f
}

// KeepBlobs makes the node cache keep every blob the served files read
// for the sandbox's life: pinned in this shim's view of it, and leased
// beside the snapshot's use-lock for `cryoctl gc` (Node.Prune). An evicted
// blob would be downloaded again, but the store may have dropped it by
// then. The logs then say what the cache downloaded.
func (r *RAM) KeepBlobs(ctx context.Context, node *nodecache.Node, snap digest.Digest) {
	r.blobs, _ = node.Blobs()
	var ds []digest.Digest
	for _, fr := range r.readers {
		for _, c := range fr.Chunks() {
			ds = append(ds, c.Stored.Digest)
			if c.Base != nil {
				ds = append(ds, c.Base.Digest)
			}
		}
	}
	if r.blobs != nil {
		for _, d := range ds {
			r.unpin = append(r.unpin, r.blobs.Pin(d))
		}
	}
	if err := node.Snapshots().Lease(snap, ds); err != nil {
		log.G(ctx).WithError(err).Warn("lazy restore: lease the snapshot's blobs in the node cache; gc may evict them")
	}
}

// Parent is the snapshot the RAM came from.
func (r *RAM) Parent() Parent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.parent
}

// Err is the first page read that failed (chunk, digest), nil if none.
func (r *RAM) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.readErr
}

// Close stops the prefetch, unmounts (call it after QEMU is gone: a
// mapping still faulting would be aborted) and removes the layer. It is
// idempotent.
func (r *RAM) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	cancel, side, next := r.cancel, r.side, r.next
	r.side, r.next = nil, nil
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	r.prefetch.Wait()
	for _, f := range []*os.File{side, next} {
		if f != nil {
			f.Close()
		}
	}
	var err error
	if r.srv != nil {
		err = r.srv.Unmount()
		os.Remove(filepath.Dir(r.Path()))
	}
	if r.layerFile != nil {
		r.layerFile.Close()
	}
	for _, fr := range r.readers {
		fr.Close()
	}
	for _, u := range r.unpin {
		u()
	}
	if r.layer != "" {
		os.Remove(filepath.Join(r.stateDir, servedRecord))
		if rerr := os.Remove(r.layer); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

// Abort ends the FUSE connection: every pending and later page read fails,
// so a QEMU stuck in one can exit.
func (r *RAM) Abort(ctx context.Context) {
	if r.srv == nil {
		return
	}
	if err := r.srv.Abort(); err != nil {
		log.G(ctx).WithError(err).Warn("abort pagefs connection")
	}
}

// Interacted says the restored sandbox answered its first request.
func (r *RAM) Interacted() {
	r.interactOnce.Do(func() {
		if r.interactedCh != nil {
			close(r.interactedCh)
		}
	})
}

// StartPrefetch fetches every chunk of the served files into the node
// cache in the background, workers at a time, so the sandbox stops
// depending on the store; it logs when it completes. A chunk the store
// lost (corrupt, truncated, missing) stops the VM as a failed page does.
func (r *RAM) StartPrefetch(ctx context.Context, workers int) {
	if workers == 0 {
		log.G(ctx).Info("lazy restore: prefetch off ([restore] prefetch_workers = 0)")
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		cancel()
		return
	}
	r.cancel = cancel
	r.prefetch.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.prefetch.Done()
		// The first request the restored sandbox answers is what its user
		// waits for: its faults get the link to themselves.
		select {
		case <-r.interactedCh:
		case <-time.After(r.prefetchDelay):
		case <-ctx.Done():
			return
		}
		start := time.Now()
		var chunks int
		var bytes int64
		for _, fr := range r.readers {
			var order []int64
			if fr == r.readers[0] {
				order = r.order // the recorded working set first
			}
			st, err := fr.Prefetch(ctx, workers, order)
			chunks += st.Chunks
			bytes += st.StoredBytes
			if err != nil {
				if ctx.Err() == nil {
					// A blob the store lost (transient failures are
					// retried): the guest would fail on its first touch
					// of it, maybe long from now. It stops now, with the
					// reason in the task's exit.
					r.failed(fmt.Errorf("lazy restore from %s: %w", r.store, err))
				}
				return
			}
		}
		l := log.G(ctx).WithFields(log.Fields{"chunks": chunks, "stored_bytes": bytes, "duration": time.Since(start), "store": r.store, "working_set_chunks": len(r.order)})
		if r.blobs != nil {
			st := r.blobs.Stats()
			l = l.WithFields(log.Fields{"cache_downloaded_bytes": st.BytesDownloaded, "cache_downloads": st.Downloads, "cache_adopted": st.Adopted})
		}
		l.Info("prefetch complete")
	}()
}

// pageReader is what a pageSource reads: a *snapshot.FileReader.
type pageReader interface {
	ReadAtContext(ctx context.Context, p []byte, off int64) (int, error)
	Size() int64
	Name() string
}

// pageSource is a served file's content: the snapshot reader under a
// deadline per read.
type pageSource struct {
	r       *RAM
	fr      pageReader
	timeout time.Duration
	grace   time.Duration
}

func (r *RAM) source(fr pageReader, timeout, grace time.Duration) *pageSource {
	return &pageSource{r: r, fr: fr, timeout: timeout, grace: grace}
}

func (s *pageSource) Size() int64 { return s.fr.Size() }

// ReadAt answers one FUSE read. A read that fails is logged with its chunk
// and the store, and pagefs answers EIO: QEMU gets SIGBUS and dies rather
// than the guest seeing a wrong byte. A read still running a grace period
// after its deadline (a store that ignores cancellation) kills QEMU and
// aborts the connection: the guest must not hang for ever. Once a read
// failed the VM is stopping: every later read fails at once, without a
// fetch (the kernel retries a failed read page by page, each of which
// would otherwise wait a whole timeout).
func (s *pageSource) ReadAt(p []byte, off int64) (int, error) {
	if err := s.r.Err(); err != nil {
		return 0, fmt.Errorf("served %s at %d: the vm stops after an earlier failure: %w", s.fr.Name(), off, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	stuck := time.AfterFunc(s.timeout+s.grace, func() {
		s.r.failed(fmt.Errorf("served %s at %d from %s: the read outlived its %s deadline by %s", s.fr.Name(), off, s.r.store, s.timeout, s.grace))
	})
	n, err := s.fr.ReadAtContext(ctx, p, off)
	stuck.Stop()
	if err != nil && n == 0 && off < s.fr.Size() {
		s.r.failed(fmt.Errorf("served %s at %d from %s: %w", s.fr.Name(), off, s.r.store, err))
	}
	return n, err
}

// failed stops the VM for err, the first time: it keeps err (the task's
// exit reports it), kills QEMU at once (not at its next fault of a page
// the kernel does not have) and aborts the connection, so that no read,
// pending or later, waits on the store.
func (r *RAM) failed(err error) {
	r.mu.Lock()
	first := r.readErr == nil
	if first {
		r.readErr = err
	}
	kill := r.onStuck
	r.mu.Unlock()
	if !first {
		return
	}
	log.L.WithError(err).WithField("store", r.store).Error("lazy restore: a page could not be served; the vm stops")
	if kill != nil {
		kill()
	}
	r.Abort(context.Background())
}

// SetKill sets how the VM is stopped once a page fails (QEMU runs); a
// failure before it stops the VM now.
func (r *RAM) SetKill(kill func()) {
	r.mu.Lock()
	r.onStuck = kill
	failed := r.readErr != nil
	r.mu.Unlock()
	if failed {
		kill()
	}
}
