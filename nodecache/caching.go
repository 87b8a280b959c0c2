package nodecache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/cryo-runtime/cryo/stores"
)

// CachingOptions tune how a CachingStore fills the cache.
type CachingOptions struct {
	// PartSize: blobs larger than this download as parallel ranged parts
	// (default 16 MiB).
	PartSize int64
	// Parallel is the number of parts of one blob in flight (default 4);
	// the store's MaxConcurrent bounds the total.
	Parallel int
	// Progress, if set, is called with the bytes each download receives.
	Progress func(desc ocispec.Descriptor, n int64)
	// StoreID names the store underneath (StoreID of its URL): a cached
	// blob is served only once this store confirmed holding it, and the
	// confirmation is remembered on disk for the node's other processes.
	// Empty: an anonymous store, whose confirmations this CachingStore
	// keeps in memory only.
	StoreID string
	// DownloadDeadline and MinRate (bytes per second) bound every download
	// from the store (lock wait included) to DownloadDeadline + size /
	// MinRate, so that a store trickling bytes cannot stretch it (defaults
	// 60s and 256 KiB/s; configs: [stores] download_deadline,
	// min_download_rate_kib).
	DownloadDeadline time.Duration
	MinRate          int64
}

// Default download bounds (CachingOptions).
const (
	DefaultDownloadDeadline = 60 * time.Second
	DefaultMinRate          = 256 << 10
)

// DownloadBound is how long a download of size bytes may take.
func (o CachingOptions) DownloadBound(size int64) time.Duration {
	d, rate := o.DownloadDeadline, o.MinRate
	if d <= 0 {
		d = DefaultDownloadDeadline
	}
	if rate <= 0 {
		rate = DefaultMinRate
	}
	if size < 0 {
		size = 0
	}
	secs := float64(size) / float64(rate)
	if secs > float64(30*24*time.Hour/time.Second) {
		secs = float64(30 * 24 * time.Hour / time.Second)
	}
	return d + time.Duration(secs*float64(time.Second))
}

// CachingStore serves blobs from the node's Blobs, downloading missing ones once
// (single-flight per store and digest across all CachingStores of the
// cache) and verifying them before they enter it. A cached blob is served
// only once the store underneath confirmed it holds it (confirm.go): the
// cache never answers for a store from what another store brought in.
// References and pushes go to the store underneath.
type CachingStore struct {
	s     stores.Store
	cache *Blobs
	opts  CachingOptions
	// id is opts.StoreID, or a random one for an anonymous store, whose
	// confirmations are not persisted.
	id      string
	persist bool
}

var (
	_ stores.Store    = (*CachingStore)(nil)
	_ VerifiedFetcher = (*CachingStore)(nil)
)

// NewCachingStore wraps s with cache c (Node.Store for the node's).
func NewCachingStore(s stores.Store, c *Blobs, opts CachingOptions) *CachingStore {
	if opts.PartSize <= 0 {
		opts.PartSize = 16 << 20
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 4
	}
	cs := &CachingStore{s: s, cache: c, opts: opts, id: opts.StoreID, persist: true}
	if !validStoreID(cs.id) {
		var rnd [16]byte
		rand.Read(rnd[:])
		cs.id, cs.persist = hex.EncodeToString(rnd[:]), false
	}
	return cs
}

// DownloadBound is how long a download of size bytes from this store may
// take (CachingOptions.DownloadBound).
func (cs *CachingStore) DownloadBound(size int64) time.Duration {
	return cs.opts.DownloadBound(size)
}

// StoreID is the id of the store underneath ("" for an anonymous one).
func (cs *CachingStore) StoreID() string {
	if !cs.persist {
		return ""
	}
	return cs.id
}

// Unwrap returns the store underneath.
func (cs *CachingStore) Unwrap() stores.Store { return cs.s }

// Blobs returns the cache.
func (cs *CachingStore) Blobs() *Blobs { return cs.cache }

// Exists answers from the cache only for a blob this store confirmed
// holding; otherwise it asks the store (and remembers a yes).
func (cs *CachingStore) Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error) {
	if stores.CheckDigest(desc.Digest) == nil && cs.cache.confirmed(cs.id, desc.Digest) {
		return true, nil
	}
	ok, err := cs.s.Exists(ctx, desc)
	if err == nil && ok {
		cs.remember(ctx, desc.Digest)
	}
	return ok, err
}

// confirm makes sure the store underneath holds desc before a cached copy
// is served for it: from a remembered confirmation, or by asking it.
func (cs *CachingStore) confirm(ctx context.Context, desc ocispec.Descriptor) error {
	if cs.cache.confirmed(cs.id, desc.Digest) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, cs.opts.DownloadBound(0))
	defer cancel()
	ok, err := cs.s.Exists(ctx, desc)
	if err != nil {
		return fmt.Errorf("blob %s: ask the store whether it holds it: %w", desc.Digest, err)
	}
	if !ok {
		return fmt.Errorf("blob %s: not in the store: %w", desc.Digest, errdefs.ErrNotFound)
	}
	cs.remember(ctx, desc.Digest)
	return nil
}

func (cs *CachingStore) remember(ctx context.Context, d digest.Digest) {
	if err := cs.cache.confirm(cs.id, d, cs.persist); err != nil {
		log.G(ctx).WithError(err).WithField("digest", d).Warn("cache: record that the store holds a blob")
	}
}

// Fetch makes sure the blob is in the cache, then reads the range from it.
// Unlike the stores underneath, bytes from a CachingStore are verified: the
// reader is a *VerifiedReader.
func (cs *CachingStore) Fetch(ctx context.Context, desc ocispec.Descriptor, offset, length int64) (io.ReadCloser, error) {
	if length < 0 {
		length = desc.Size - offset
	}
	if offset < 0 || offset > desc.Size || length < 0 || offset+length > desc.Size {
		return nil, fmt.Errorf("fetch %s: range %d+%d outside %d bytes: %w", desc.Digest, offset, length, desc.Size, errdefs.ErrOutOfRange)
	}
	v, err := cs.openVerified(ctx, desc)
	if err != nil {
		return nil, err
	}
	v.r = io.NewSectionReader(v.f, offset, length)
	return v, nil
}

func (cs *CachingStore) Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	return cs.s.Push(ctx, desc, r)
}
func (cs *CachingStore) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	return cs.s.Resolve(ctx, ref)
}
func (cs *CachingStore) Tag(ctx context.Context, desc ocispec.Descriptor, ref string) error {
	return cs.s.Tag(ctx, desc, ref)
}
func (cs *CachingStore) Tags(ctx context.Context) ([]string, error) { return cs.s.Tags(ctx) }
func (cs *CachingStore) Untag(ctx context.Context, ref string) error {
	return cs.s.Untag(ctx, ref)
}

// Ensure puts the blob in the cache if it is not there. Concurrent callers
// for one digest share one download; it is cancelled only when every caller
// waiting for it has gone.
func (cs *CachingStore) Ensure(ctx context.Context, desc ocispec.Descriptor) error {
	if err := desc.Digest.Validate(); err != nil {
		return fmt.Errorf("digest %q: %w: %w", desc.Digest, err, errdefs.ErrInvalidArgument)
	}
	if desc.Size < 0 {
		return fmt.Errorf("blob %s: unknown size: %w", desc.Digest, errdefs.ErrInvalidArgument)
	}
	c := cs.cache
	key := confKey{cs.id, desc.Digest}
	if c.Has(desc.Digest) {
		// Cached, maybe from another store: served (and marked used) only
		// once this one confirmed it holds the blob.
		if err := cs.confirm(ctx, desc); err != nil {
			return err
		}
		if c.touch(desc.Digest) {
			c.hits.Add(1)
			return nil
		}
	}
	c.mu.Lock()
	if c.entries[desc.Digest] != nil { // landed meanwhile
		c.mu.Unlock()
		if err := cs.confirm(ctx, desc); err != nil {
			return err
		}
		c.hits.Add(1)
		return nil
	}
	c.misses.Add(1)
	f := c.flights[key]
	if f != nil {
		f.waiters++
		c.shared.Add(1)
	} else {
		// The whole download, lock wait included, is bounded: a store
		// trickling bytes is cut.
		bound := cs.opts.DownloadBound(desc.Size)
		fctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), bound,
			fmt.Errorf("download %s: not done within %s (download_deadline + size / min_download_rate_kib): %w", desc.Digest, bound, context.DeadlineExceeded))
		f = &flight{done: make(chan struct{}), waiters: 1, cancel: cancel}
		c.flights[key] = f
		c.downloads.Add(1)
		go func() {
			err := cs.download(fctx, desc)
			if err != nil && fctx.Err() != nil {
				err = fmt.Errorf("%w (%w)", context.Cause(fctx), err)
			}
			c.mu.Lock()
			if c.flights[key] == f {
				delete(c.flights, key)
			}
			c.mu.Unlock()
			f.err = err
			cancel()
			close(f.done)
		}()
	}
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		c.mu.Lock()
		if f.waiters--; f.waiters == 0 {
			// Nobody wants it any more: stop it, and let a later caller
			// start afresh rather than join a cancelled download.
			f.cancel()
			if c.flights[key] == f {
				delete(c.flights, key)
			}
		}
		c.mu.Unlock()
		return ctx.Err()
	}
}

// flight is one download in progress.
type flight struct {
	done    chan struct{}
	err     error
	waiters int // guarded by Blobs.mu
	cancel  context.CancelFunc
}

// download fetches desc into a temp file, in parallel ranged parts when it
// is large, verifies it and commits it to the cache.
func (cs *CachingStore) download(ctx context.Context, desc ocispec.Descriptor) error {
	c := cs.cache
	// One download per node, not per process: shims of clones restoring
	// one snapshot at once wait for the first, then find its blob.
	unlock, err := c.lockDownload(ctx, cs.id, desc.Digest)
	if err != nil {
		return fmt.Errorf("download %s: %w", desc.Digest, err)
	}
	defer unlock()
	if c.onDisk(desc) {
		// Another process, or a download from another store, put it
		// there: ours only if our store holds it too.
		if err := cs.confirm(ctx, desc); err != nil {
			return err
		}
		if c.adopt(desc) {
			return nil
		}
	}
	tmp, err := c.newTemp()
	if err != nil {
		return err
	}
	defer tmp.discard()
	count := func(n int64) {
		c.downloaded.Add(n)
		if cs.opts.Progress != nil {
			cs.opts.Progress(desc, n)
		}
	}
	if desc.Size <= cs.opts.PartSize {
		rc, err := cs.s.Fetch(ctx, desc, 0, -1)
		if err != nil {
			return fmt.Errorf("download %s: %w", desc.Digest, err)
		}
		defer rc.Close()
		if _, err := stores.CopyVerified(ctx, tmp.f, &progressReader{r: rc, fn: count}, desc); err != nil {
			return fmt.Errorf("download %s: %w", desc.Digest, err)
		}
		return cs.commit(ctx, tmp, desc)
	}
	if err := tmp.f.Truncate(desc.Size); err != nil {
		return fmt.Errorf("download %s: %w", desc.Digest, err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cs.opts.Parallel)
	for off := int64(0); off < desc.Size; off += cs.opts.PartSize {
		n := min(cs.opts.PartSize, desc.Size-off)
		last := off+n == desc.Size
		g.Go(func() error { return cs.fetchPart(gctx, tmp, desc, off, n, last, count) })
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("download %s: %w", desc.Digest, err)
	}
	if _, err := stores.CopyVerified(ctx, io.Discard, io.NewSectionReader(tmp.f, 0, desc.Size+1), desc); err != nil {
		return fmt.Errorf("download %s: %w", desc.Digest, err)
	}
	return cs.commit(ctx, tmp, desc)
}

// commit puts a blob the store served (and that verified) into the cache:
// the store holds it.
func (cs *CachingStore) commit(ctx context.Context, tmp *cacheTemp, desc ocispec.Descriptor) error {
	cs.remember(ctx, desc.Digest)
	return cs.cache.commit(tmp, desc)
}

// fetchPart writes bytes [off, off+n) into tmp. The last part reads to the
// end of the object so that extra bytes after the blob are noticed.
func (cs *CachingStore) fetchPart(ctx context.Context, tmp *cacheTemp, desc ocispec.Descriptor, off, n int64, last bool, count func(int64)) error {
	length := n
	if last {
		length = -1
	}
	rc, err := cs.s.Fetch(ctx, desc, off, length)
	if err != nil {
		return err
	}
	defer rc.Close()
	got, err := io.Copy(io.NewOffsetWriter(tmp.f, off), io.LimitReader(&progressReader{r: stores.ContextReader(ctx, rc), fn: count}, n+1))
	if err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("part at %d: got %s bytes, want %d: %w: %w", off, sizeDesc(got, n), n, stores.ErrDigestMismatch, errdefs.ErrDataLoss)
	}
	return nil
}

type progressReader struct {
	r  io.Reader
	fn func(int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.fn(int64(n))
	}
	return n, err
}

// FetchVerified returns the whole blob desc from the cache, downloading it
// first if needed: bytes the cache verified against desc, which a reader
// need not hash again.
func (cs *CachingStore) FetchVerified(ctx context.Context, desc ocispec.Descriptor) (Verified, error) {
	return cs.openVerified(ctx, desc)
}

// openVerified ensures the blob is cached and opens it.
func (cs *CachingStore) openVerified(ctx context.Context, desc ocispec.Descriptor) (*VerifiedReader, error) {
	for try := 0; ; try++ {
		if err := cs.Ensure(ctx, desc); err != nil {
			return nil, err
		}
		v, err := cs.cache.open(desc.Digest)
		if err == nil {
			if v.size != desc.Size {
				v.Close()
				return nil, fmt.Errorf("fetch %s: cached blob has %d bytes, descriptor says %d: %w", desc.Digest, v.size, desc.Size, errdefs.ErrDataLoss)
			}
			return v, nil
		}
		if !errdefs.IsNotFound(err) || try > 0 {
			return nil, err
		}
		// Evicted between Ensure and Open (by us or another process), or
		// torn by a machine crash: once more.
	}
}

func sizeDesc(n, want int64) string {
	if n > want {
		return fmt.Sprintf("more than %d", want)
	}
	return fmt.Sprint(n)
}

func randomSuffix() string {
	var rnd [6]byte
	rand.Read(rnd[:])
	return hex.EncodeToString(rnd[:])
}
