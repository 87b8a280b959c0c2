package nodecache

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/bootid"
	"github.com/cryo-runtime/cryo/internal/flock"
	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/stores"
)

// Blobs is the node's content-addressed blob cache (<cache>/blobs):
//
//	<dir>/blobs/<alg>/<hex>   verified blobs, 0600
//	<dir>/tmp/                downloads in progress (stale ones removed on open)
//
// A blob enters the cache only after its size and digest matched, by rename
// from tmp/. The cache is bounded by maxBytes: least recently used blobs are
// evicted, except pinned ones. Recency lives in memory and in the files'
// mtime, so a restarted process keeps the order. Several processes may share
// a directory (the shim, cryoctl pull): blobs are immutable and renamed into
// place, so they never see partial content; each process enforces the
// limit and its pins on its own view, a blob another process evicted is
// downloaded again, and no process evicts what running lazy sandboxes of
// any process leased (Snapshots.Lease, read through the Node).
//
// The cache serves every tenant of the node, but a blob only to a
// CachingStore whose own store confirmed holding it (confirm.go).
//
// Blobs are written without fsync: the page cache outlives a crashed
// process, and a blob is stamped with the boot it was verified in (an
// xattr); Open trusts a blob of this boot and hashes again one from an
// earlier boot, which a machine crash may have torn.
//
// Every file is opened beneath the directory without following symlinks
// and only if it is a regular file (safefs): a symlink or a FIFO planted
// in the cache is refused, never followed, never waited on.
type Blobs struct {
	dir  string
	root *safefs.Dir
	max  int64

	mu      sync.Mutex
	entries map[digest.Digest]*cacheEntry
	lru     *list.List // of *cacheEntry, front = most recently used
	size    int64
	pins    map[digest.Digest]int
	flights map[confKey]*flight  // by (store, digest)
	conf    map[confKey]struct{} // confirmations seen (confirm.go)
	// leased, if set, lists the blobs running lazy sandboxes of the node
	// read (Snapshots.Leased): no prune evicts them.
	leased func() ([]digest.Digest, error)

	hits, misses, downloads, shared, downloaded, evictions, adopted atomic.Int64
}

type cacheEntry struct {
	d    digest.Digest
	size int64
	elem *list.Element
}

// BlobStats are the cache's counters since OpenBlobs.
type BlobStats struct {
	Hits            int64 `json:"hits"`            // blobs served from the cache
	Misses          int64 `json:"misses"`          // blobs not in the cache when asked for
	Downloads       int64 `json:"downloads"`       // downloads started
	SharedDownloads int64 `json:"sharedDownloads"` // callers that joined a download in flight
	BytesDownloaded int64 `json:"bytesDownloaded"` // bytes read from stores
	Evictions       int64 `json:"evictions"`
	// Adopted counts blobs another process of the node downloaded while
	// this one waited for it, or since it opened the cache.
	Adopted  int64 `json:"adopted"`
	Blobs    int64 `json:"blobs"` // blobs in the cache now
	Bytes    int64 `json:"bytes"` // their total size
	MaxBytes int64 `json:"maxBytes"`
}

// OpenBlobs opens (creating) the cache in dir, bounded by maxBytes (<= 0: no
// bound). Blobs from earlier runs are kept.
func OpenBlobs(dir string, maxBytes int64) (*Blobs, error) {
	c := &Blobs{
		dir: dir, max: maxBytes,
		entries: map[digest.Digest]*cacheEntry{}, lru: list.New(),
		pins: map[digest.Digest]int{}, flights: map[confKey]*flight{}, conf: map[confKey]struct{}{},
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cache %s: %w", dir, err)
	}
	root, err := safefs.OpenDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cache %s: %w", dir, err)
	}
	c.root = root
	for _, d := range []string{"tmp", "blobs/sha256"} {
		sub, err := root.MkdirAll(d, 0o700)
		if err != nil {
			return nil, fmt.Errorf("cache %s: %w", dir, err)
		}
		sub.Close()
	}
	if err := c.load(); err != nil {
		return nil, fmt.Errorf("cache %s: %w", dir, err)
	}
	c.removeStaleTemps(time.Hour)
	return c, nil
}

// removeStaleTemps deletes downloads that crashed processes left behind.
// Recent temp files may belong to another process using the same cache.
func (c *Blobs) removeStaleTemps(age time.Duration) {
	tmp, err := c.root.Sub("tmp")
	if err != nil {
		return
	}
	defer tmp.Close()
	ents, _ := tmp.ReadDir()
	for _, e := range ents {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > age {
			tmp.Remove(e.Name())
		}
	}
}

// load indexes the blobs already on disk, oldest mtime last in the LRU.
func (c *Blobs) load() error {
	type found struct {
		d     digest.Digest
		size  int64
		mtime time.Time
	}
	var all []found
	blobs, err := c.root.Sub("blobs")
	if err != nil {
		return err
	}
	defer blobs.Close()
	algs, err := blobs.ReadDir()
	if err != nil {
		return err
	}
	for _, a := range algs {
		if !a.IsDir() {
			continue // a symlink or a file: never followed
		}
		ents, err := os.ReadDir(filepath.Join(c.dir, "blobs", a.Name()))
		if err != nil {
			return err
		}
		for _, e := range ents {
			d := digest.NewDigestFromEncoded(digest.Algorithm(a.Name()), e.Name())
			info, err := e.Info()
			if d.Validate() != nil || err != nil || !info.Mode().IsRegular() {
				continue
			}
			all = append(all, found{d, info.Size(), info.ModTime()})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mtime.After(all[j].mtime) })
	for _, f := range all {
		e := &cacheEntry{d: f.d, size: f.size}
		e.elem = c.lru.PushBack(e)
		c.entries[f.d] = e
		c.size += f.size
	}
	return nil
}

// Dir returns the cache directory.
func (c *Blobs) Dir() string { return c.dir }

func (c *Blobs) blobPath(d digest.Digest) string {
	return filepath.Join(c.dir, c.blobName(d))
}

// blobName is the blob's name under the cache directory. Digests reach
// the cache validated (copyVerified) or listed from its own directory.
func (c *Blobs) blobName(d digest.Digest) string {
	return "blobs/" + d.Algorithm().String() + "/" + d.Encoded()
}

// removeBlob removes the blob's file, never following a symlink.
func (c *Blobs) removeBlob(d digest.Digest) error {
	dir, err := c.root.Sub("blobs/" + d.Algorithm().String())
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Remove(d.Encoded())
}

// Has reports whether d is in the cache (without counting a hit).
func (c *Blobs) Has(d digest.Digest) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[d] != nil
}

// touch marks d as used now; false when d is not cached.
func (c *Blobs) touch(d digest.Digest) bool {
	c.mu.Lock()
	e := c.entries[d]
	if e != nil {
		c.lru.MoveToFront(e.elem)
	}
	c.mu.Unlock()
	if e != nil {
		if f, err := c.root.OpenFile(c.blobName(d), os.O_RDONLY, 0); err == nil {
			now := unix.NsecToTimeval(time.Now().UnixNano())
			_ = unix.Futimes(int(f.Fd()), []unix.Timeval{now, now})
			f.Close()
		}
	}
	return e != nil
}

// Open opens a cached blob for reading and marks it used. A reader keeps
// working if the blob is evicted meanwhile. The blob is verified: when it
// entered the cache, or, if that was in an earlier boot of the host, now (a
// blob a machine crash tore is removed and reported as not found).
func (c *Blobs) Open(d digest.Digest) (*VerifiedReader, error) {
	if !c.touch(d) {
		return nil, fmt.Errorf("blob %s not in cache: %w", d, errdefs.ErrNotFound)
	}
	return c.open(d)
}

// open is Open without marking the blob used.
func (c *Blobs) open(d digest.Digest) (*VerifiedReader, error) {
	f, err := c.root.Open(c.blobName(d))
	if errors.Is(err, fs.ErrNotExist) {
		c.forget(d)
		return nil, fmt.Errorf("blob %s vanished from cache: %w", d, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !stampedThisBoot(f) {
		if err := verifyFile(f, d, st.Size()); err != nil {
			f.Close()
			// Torn by a crash (or changed behind our back): useless to
			// anyone, pinned or not; the caller downloads it again.
			if rerr := c.removeBlob(d); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				return nil, fmt.Errorf("remove corrupt %w: %w", err, rerr)
			}
			c.forget(d)
			log.L.WithError(err).WithField("digest", d).Warn("cache: removed a blob that no longer matches its digest")
			return nil, fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
		}
		stamp(f)
	}
	return &VerifiedReader{r: io.NewSectionReader(f, 0, st.Size()), f: f, d: d, size: st.Size()}, nil
}

// Verified is a whole blob that the node cache verified against its
// descriptor (size and digest) when it entered the cache, or again after a
// reboot: a reader of it need not hash the bytes a second time.
type Verified interface {
	io.ReaderAt
	io.Closer
	Size() int64
}

// VerifiedFetcher is a store that hands out only blobs it verified (the
// node cache's CachingStore). Bytes from any other stores.Store are
// unverified and must be hashed by their reader.
type VerifiedFetcher interface {
	FetchVerified(ctx context.Context, desc ocispec.Descriptor) (Verified, error)
}

var _ Verified = (*VerifiedReader)(nil)

// VerifiedReader reads a blob of the node cache, which the cache verified
// against its digest. Only the cache makes them; bytes from any other store
// are unverified (Store.Fetch). Read reads the range it was opened for;
// ReadAt reads the whole blob.
type VerifiedReader struct {
	r    *io.SectionReader
	f    *os.File
	d    digest.Digest
	size int64
}

func (v *VerifiedReader) Read(b []byte) (int, error) {
	if v.r == nil {
		return 0, io.EOF
	}
	return v.r.Read(b)
}

// ReadAt reads the blob (not only the range) at off.
func (v *VerifiedReader) ReadAt(b []byte, off int64) (int, error) {
	if v.f == nil || off >= v.size {
		return 0, io.EOF
	}
	if rest := v.size - off; int64(len(b)) > rest {
		n, err := v.f.ReadAt(b[:rest], off)
		if err == nil {
			err = io.EOF
		}
		return n, err
	}
	return v.f.ReadAt(b, off)
}

func (v *VerifiedReader) Close() error {
	if v.f == nil {
		return nil
	}
	return v.f.Close()
}

// Digest is the digest the blob was verified against ("" for a reader not
// made by the cache).
func (v *VerifiedReader) Digest() digest.Digest { return v.d }

// Size is the blob's size.
func (v *VerifiedReader) Size() int64 { return v.size }

// A blob is trusted without hashing it again when the extended attribute
// stampAttr names this boot: the cache writes blobs without fsync, so after
// a machine crash a blob may be torn, but one written in this boot is read
// back from the page cache exactly as it was verified. A file system without
// user xattrs keeps no stamps: its blobs are verified on every Open.
const stampAttr = "user.cryo.verified-boot"

func stampedThisBoot(f *os.File) bool {
	id, err := bootid.Get()
	if err != nil {
		return false
	}
	var buf [64]byte
	n, err := unix.Fgetxattr(int(f.Fd()), stampAttr, buf[:])
	return err == nil && string(buf[:n]) == id
}

// stamp marks f as verified in this boot (best effort).
func stamp(f *os.File) {
	if id, err := bootid.Get(); err == nil {
		_ = unix.Fsetxattr(int(f.Fd()), stampAttr, []byte(id), 0)
	}
}

// verifyFile hashes the first size bytes of f (which must be all of it).
func verifyFile(f *os.File, d digest.Digest, size int64) error {
	_, err := stores.CopyVerified(context.Background(), io.Discard, io.NewSectionReader(f, 0, size+1), ocispec.Descriptor{Digest: d, Size: size})
	return err
}

// Pin keeps d from eviction (also before it is downloaded) until the
// returned func is called. Pins nest.
func (c *Blobs) Pin(d digest.Digest) (unpin func()) {
	c.mu.Lock()
	c.pins[d]++
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			if c.pins[d]--; c.pins[d] <= 0 {
				delete(c.pins, d)
			}
			c.mu.Unlock()
		})
	}
}

// Add verifies r against desc and stores it. Content that does not match
// never enters the cache.
func (c *Blobs) Add(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	tmp, err := c.newTemp()
	if err != nil {
		return err
	}
	defer tmp.discard()
	if _, err := stores.CopyVerified(ctx, tmp.f, r, desc); err != nil {
		return err
	}
	return c.commit(tmp, desc)
}

type cacheTemp struct {
	f        *os.File
	dir      *safefs.Dir // tmp/
	name     string
	finished bool
}

func (c *Blobs) newTemp() (*cacheTemp, error) {
	dir, err := c.root.Sub("tmp")
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	name := "blob-" + randomSuffix()
	f, err := dir.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("cache: %w", err)
	}
	return &cacheTemp{f: f, dir: dir, name: name}, nil
}

func (t *cacheTemp) discard() {
	if !t.finished {
		t.f.Close()
		t.dir.Remove(t.name)
	}
	t.dir.Close()
}

// lockDownload takes the node-wide lock on downloading d from store (a
// flock on locks/<store>-<hex>, which other processes of the cache take
// too): a slow store holds up only the downloads from itself. Unlocking
// removes the lock file: a later locker always checks for the blob first.
func (c *Blobs) lockDownload(ctx context.Context, store string, d digest.Digest) (unlock func(), _ error) {
	dir, err := c.root.MkdirAll("locks", 0o700)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	name := store + "-" + d.Encoded()
	for {
		f, err := dir.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		if err := flock.Wait(ctx, f, unix.LOCK_EX); err != nil {
			f.Close()
			return nil, err
		}
		// The holder before us may have removed the file we locked.
		if sameFile(f, filepath.Join(c.dir, "locks", name)) {
			return func() {
				os.Remove(filepath.Join(c.dir, "locks", name))
				f.Close()
			}, nil
		}
		f.Close()
	}
}

// onDisk reports whether a regular file of desc's size is at the blob's
// place (another process, or a download from another store, put it there).
func (c *Blobs) onDisk(desc ocispec.Descriptor) bool {
	info, err := c.root.Lstat(c.blobName(desc.Digest))
	return err == nil && info.Mode().IsRegular() && info.Size() == desc.Size
}

// adopt takes in blob desc if another process of the node committed it
// since this one loaded the cache. A blob of an earlier boot is hashed
// again, as Open does.
func (c *Blobs) adopt(desc ocispec.Descriptor) bool {
	f, err := c.root.Open(c.blobName(desc.Digest))
	if err != nil {
		return false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() != desc.Size {
		return false
	}
	if !stampedThisBoot(f) {
		if verifyFile(f, desc.Digest, desc.Size) != nil {
			return false
		}
		stamp(f)
	}
	c.mu.Lock()
	if c.entries[desc.Digest] == nil {
		e := &cacheEntry{d: desc.Digest, size: desc.Size}
		e.elem = c.lru.PushFront(e)
		c.entries[desc.Digest] = e
		c.size += desc.Size
	}
	c.mu.Unlock()
	c.adopted.Add(1)
	return true
}

// commit renames a verified temp file into the cache and evicts down to
// the bound.
func (c *Blobs) commit(t *cacheTemp, desc ocispec.Descriptor) error {
	stamp(t.f)
	if err := t.f.Close(); err != nil {
		return fmt.Errorf("cache %s: %w", desc.Digest, err)
	}
	blobs, err := c.root.MkdirAll("blobs/"+desc.Digest.Algorithm().String(), 0o700)
	if err != nil {
		return fmt.Errorf("cache %s: %w", desc.Digest, err)
	}
	err = t.dir.Rename(t.name, blobs, desc.Digest.Encoded())
	blobs.Close()
	if err != nil {
		return fmt.Errorf("cache %s: %w", desc.Digest, err)
	}
	t.finished = true
	c.mu.Lock()
	if e := c.entries[desc.Digest]; e != nil {
		c.lru.MoveToFront(e.elem)
	} else {
		e = &cacheEntry{d: desc.Digest, size: desc.Size}
		e.elem = c.lru.PushFront(e)
		c.entries[desc.Digest] = e
		c.size += desc.Size
	}
	c.mu.Unlock()
	if c.max > 0 {
		if _, err := c.Prune(c.max); err != nil {
			return err
		}
	}
	return nil
}

// Prune evicts least recently used blobs until the cache holds at most
// target bytes, and returns the bytes freed. It keeps pinned blobs, blobs
// being downloaded, and blobs that running lazy sandboxes of any process
// of the node leased (Snapshots.Lease, when the cache is a Node's): they
// may keep it above target.
func (c *Blobs) Prune(target int64) (int64, error) {
	var freed int64
	c.mu.Lock()
	over := c.size > target
	leasedFn := c.leased
	c.mu.Unlock()
	if !over {
		return 0, nil
	}
	keep := map[digest.Digest]bool{}
	if leasedFn != nil {
		ds, err := leasedFn()
		if err != nil {
			// Not knowing what is leased, evict nothing.
			return 0, fmt.Errorf("prune blob cache: read leases: %w", err)
		}
		for _, d := range ds {
			keep[d] = true
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	busy := map[digest.Digest]bool{}
	for k := range c.flights {
		busy[k.d] = true
	}
	for el := c.lru.Back(); el != nil && c.size > target; {
		e := el.Value.(*cacheEntry)
		el = el.Prev()
		if c.pins[e.d] > 0 || busy[e.d] || keep[e.d] {
			continue
		}
		if err := c.removeBlob(e.d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return freed, fmt.Errorf("evict %s: %w", e.d, err)
		}
		c.dropLocked(e)
		freed += e.size
		c.evictions.Add(1)
	}
	if c.size > target {
		log.L.WithField("bytes", c.size).WithField("limit", target).Debug("cache: over its limit, the rest is pinned")
	}
	return freed, nil
}

// Remove deletes one blob from the cache.
func (c *Blobs) Remove(d digest.Digest) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[d]
	if e == nil {
		return fmt.Errorf("blob %s not in cache: %w", d, errdefs.ErrNotFound)
	}
	if c.pins[d] > 0 {
		return fmt.Errorf("blob %s is pinned: %w", d, errdefs.ErrFailedPrecondition)
	}
	if err := c.removeBlob(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", d, err)
	}
	c.dropLocked(e)
	return nil
}

func (c *Blobs) forget(d digest.Digest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[d]; e != nil {
		c.dropLocked(e)
	}
}

func (c *Blobs) dropLocked(e *cacheEntry) {
	c.lru.Remove(e.elem)
	delete(c.entries, e.d)
	c.size -= e.size
}

// Stats returns the counters.
func (c *Blobs) Stats() BlobStats {
	c.mu.Lock()
	blobs, size := int64(len(c.entries)), c.size
	c.mu.Unlock()
	return BlobStats{
		Hits: c.hits.Load(), Misses: c.misses.Load(), Downloads: c.downloads.Load(),
		SharedDownloads: c.shared.Load(), BytesDownloaded: c.downloaded.Load(),
		Evictions: c.evictions.Load(), Adopted: c.adopted.Load(), Blobs: blobs, Bytes: size, MaxBytes: c.max,
	}
}
