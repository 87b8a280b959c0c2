package snapshot

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
)

// serving is what a snapshot's served files share: the decode memory
// budget, the decode buffers and the decoded chunks.
type serving struct {
	budget *semaphore.Weighted
	bufs   sync.Pool // *chunkBufs
	cache  *decodedCache
}

func newServing(cs, budget int64) *serving {
	s := &serving{budget: semaphore.NewWeighted(budget), cache: newDecodedCache(decodedCacheSize(cs, budget))}
	s.bufs.New = func() any { return &chunkBufs{} }
	return s
}

// ChunkDesc is one stored chunk of a served file: where it lies, what the
// store holds, and for a delta the full chunk it applies to. A checkpoint of
// a lazily restored sandbox reuses the descriptors of the chunks the guest
// did not change.
type ChunkDesc struct {
	Offset, Size int64
	Stored       ocispec.Descriptor
	// Base is the delta's base (a full chunk), nil for a full chunk.
	Base *ocispec.Descriptor
}

// FileReader reads one file of a snapshot on demand: ReadAt fetches the
// chunks the range touches (through the snapshot's store, which for a
// restore is the node cache: one download per chunk per node), verifies
// their digests, decrypts, decompresses and, for a delta, applies it to its
// base. Holes read as zeros without a fetch. A chunk that fails is an
// error, never zeros or a short read. It is safe for concurrent use.
type FileReader struct {
	s    *Snapshot
	name string
	size int64
	cs   int64
	// chunks are the stored chunks by index off/cs (absent: a hole), idxs
	// their indexes in order: as many entries as the manifest has chunks of
	// the file, whatever size the file claims.
	chunks map[int64]*servedChunk
	idxs   []int64
	codec  *chunkCodec

	mu       sync.Mutex
	flights  map[int64]*chunkFlight
	firstErr error
	// order is the chunks page faults decoded, in the order of their
	// first fault (the working set a checkpoint records).
	order   []int64
	ordered map[int64]bool

	fetched, fetchedBytes atomic.Int64
}

type servedChunk struct {
	ref  chunkRef
	base *baseRef // nil: a full chunk
}

type decodedChunk struct {
	key decodedKey
	raw []byte
}

// decodedKey is a decoded chunk's place: file name and chunk index.
type decodedKey struct {
	file string
	idx  int64
}

type chunkFlight struct {
	done chan struct{}
	err  error
}

// chunkBufs are a decode's buffers, each made when a decode first needs it:
// the stored chunk, the decrypted one (encrypted snapshots) and a delta's
// payload (deltas).
type chunkBufs struct{ stored, scratch, payload []byte }

// grow returns b with length n, reallocated if it is shorter.
func grow(b []byte, n int64) []byte {
	if int64(cap(b)) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// decodedCache keeps the chunks a snapshot's served files decoded last:
// a fault cluster reads a chunk in max_read pieces (1 MiB), so the chunk it
// is in is kept for the next pieces, not for ever (the page cache is the
// real cache). It holds at most max bytes (and always the newest chunk),
// however many files the snapshot serves, and nothing once it has not been
// used for idle: an idle sandbox, which is most of them, would otherwise
// keep up to 16 MiB of decoded chunks in its shim for its whole life.
type decodedCache struct {
	mu         sync.Mutex
	max, bytes int64
	m          map[decodedKey]*list.Element // of *decodedChunk
	lru        *list.List
	// free are evicted chunks' buffers for the next decodes, as long as
	// they fit in max beside the cached chunks: decodes then make no
	// garbage, and the heap stays near its bound.
	free      [][]byte
	freeBytes int64

	idle    time.Duration
	lastUse time.Time
	dropper *time.Timer // armed while the cache holds anything
}

// decodedIdle is how long the cache keeps its chunks unused: the pieces of
// one fault cluster come within milliseconds of each other.
const decodedIdle = 10 * time.Second

// keepDecoded is how many decoded chunks the cache aims to keep (fewer
// when they are large: decodedCacheSize).
const keepDecoded = 16

// decodedCacheSize is the cache's bound for a chunk size and a decode
// memory budget: keepDecoded chunks, at most half the budget, at least
// two chunks (one cached, one recycled).
func decodedCacheSize(cs, budget int64) int64 {
	return max(2*cs, min(keepDecoded*cs, budget/2))
}

func newDecodedCache(max int64) *decodedCache {
	return &decodedCache{max: max, m: map[decodedKey]*list.Element{}, lru: list.New(), idle: decodedIdle}
}

// used records a use and arms the drop (c.mu held).
func (c *decodedCache) used() {
	c.lastUse = time.Now()
	if c.dropper == nil {
		c.dropper = time.AfterFunc(c.idle, c.dropIfIdle)
	}
}

// dropIfIdle empties the cache, chunks and spare buffers, when it has not
// been used for c.idle; else it looks again when that time has passed.
func (c *decodedCache) dropIfIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if unused := time.Since(c.lastUse); unused < c.idle {
		c.dropper.Reset(c.idle - unused)
		return
	}
	clear(c.m)
	c.lru.Init()
	c.bytes, c.free, c.freeBytes = 0, nil, 0
	c.dropper = nil
}

// read calls fn with chunk k under the cache's lock, if it is cached.
func (c *decodedCache) read(k decodedKey, fn func(raw []byte)) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok {
		return false
	}
	c.used()
	c.lru.MoveToFront(e)
	fn(e.Value.(*decodedChunk).raw)
	return true
}

// put caches raw, which its caller no longer reads, as chunk k.
func (c *decodedCache) put(k decodedKey, raw []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok {
		c.recycle(raw)
		return
	}
	c.used()
	c.m[k] = c.lru.PushFront(&decodedChunk{key: k, raw: raw})
	c.bytes += int64(cap(raw))
	for c.bytes > c.max && c.lru.Len() > 1 {
		old := c.lru.Remove(c.lru.Back()).(*decodedChunk)
		delete(c.m, old.key)
		c.bytes -= int64(cap(old.raw))
		c.recycle(old.raw)
	}
}

// recycle keeps b for a later decode if it fits (c.mu held).
func (c *decodedCache) recycle(b []byte) {
	if c.bytes+c.freeBytes+int64(cap(b)) <= c.max {
		c.used()
		c.free = append(c.free, b[:0])
		c.freeBytes += int64(cap(b))
	}
}

// buffer returns a buffer of length n and capacity at least size for a
// decode: a recycled one, else, when the cache is full, the least
// recently used chunk's (evicted), else a new one.
func (c *decodedCache) buffer(n, size int64) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.free) > 0 {
		b := c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
		c.freeBytes -= int64(cap(b))
		if int64(cap(b)) >= size {
			return b[:n]
		}
	}
	if c.bytes+size > c.max && c.lru.Len() > 0 {
		old := c.lru.Remove(c.lru.Back()).(*decodedChunk)
		delete(c.m, old.key)
		c.bytes -= int64(cap(old.raw))
		if int64(cap(old.raw)) >= size {
			return old.raw[:n]
		}
	}
	return make([]byte, n, size)
}

// release gives back a buffer that no one reads (a failed decode's).
func (c *decodedCache) release(b []byte) {
	c.mu.Lock()
	c.recycle(b)
	c.mu.Unlock()
}

// decodeWeight is what one decode of a chunk takes from the snapshot's
// decode budget: the buffers it uses (chunkBufs and the decoded chunk),
// never more than the whole budget, so that one decode always proceeds.
func decodeWeight(cs int64, encrypted, delta bool, budget int64) int64 {
	w := maxStoredSize(cs) + 1 + cs
	if encrypted {
		w += maxStoredSize(cs)
	}
	if delta {
		w += cs
	}
	return min(w, budget)
}

// ServeFile returns a reader of the snapshot file name. An encrypted
// snapshot needs its decryption key. Nothing is fetched yet.
func (s *Snapshot) ServeFile(name string) (*FileReader, error) {
	i := slices.IndexFunc(s.Metadata.Files, func(f FileInfo) bool { return f.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("snapshot has no file %s: %w", name, errdefs.ErrNotFound)
	}
	cs := s.Metadata.ChunkSize
	size := s.Metadata.Files[i].Size
	codec, _, _, err := s.readCodec(1, 1)
	if err != nil {
		return nil, fmt.Errorf("serve %s: %w", name, err)
	}
	// Sparse: the index costs what the manifest names, never what the
	// file's logical size claims (a record may claim 4 TiB disks).
	r := &FileReader{s: s, name: name, size: size, cs: cs, codec: codec,
		chunks: map[int64]*servedChunk{}, flights: map[int64]*chunkFlight{}, ordered: map[int64]bool{}}
	for _, c := range s.chunks {
		if c.file == name {
			r.chunks[c.off/cs] = &servedChunk{ref: c}
		}
	}
	for _, d := range s.deltas {
		if d.file == name {
			b := s.bases[d.base]
			r.chunks[d.off/cs] = &servedChunk{ref: d.chunkRef, base: &b}
		}
	}
	r.idxs = slices.Sorted(maps.Keys(r.chunks))
	return r, nil
}

// Name is the snapshot file served.
func (r *FileReader) Name() string { return r.name }

// Order is the chunks the reader's page faults decoded so far, in the
// order of their first fault: the working set.
func (r *FileReader) Order() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

// Size is the file's logical size.
func (r *FileReader) Size() int64 { return r.size }

// ChunkSize is the snapshot's chunk size.
func (r *FileReader) ChunkSize() int64 { return r.cs }

// Chunks lists the file's stored chunks in offset order.
func (r *FileReader) Chunks() []ChunkDesc {
	var out []ChunkDesc
	for _, i := range r.idxs {
		c := r.chunks[i]
		d := ChunkDesc{Offset: c.ref.off, Size: c.ref.size, Stored: c.ref.desc}
		if c.base != nil {
			b := c.base.desc
			d.Base = &b
		}
		out = append(out, d)
	}
	return out
}

// Err is the first error a read returned, nil if none did: the sandbox
// reports it when its QEMU dies of it.
func (r *FileReader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.firstErr
}

// Fetched reports how many chunks ReadAt decoded and their stored bytes.
func (r *FileReader) Fetched() (chunks, storedBytes int64) {
	return r.fetched.Load(), r.fetchedBytes.Load()
}

// Close releases the decoder.
func (r *FileReader) Close() error {
	r.codec.Close()
	return nil
}

// ReadAt reads len(p) bytes at off (fewer only at the end of the file,
// with io.EOF).
func (r *FileReader) ReadAt(p []byte, off int64) (int, error) {
	return r.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt under ctx (a deadline on the fetches).
func (r *FileReader) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read %s at %d: %w", r.name, off, errdefs.ErrInvalidArgument)
	}
	if off >= r.size {
		return 0, io.EOF
	}
	want := len(p)
	p = p[:min(int64(want), r.size-off)]
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		idx := pos / r.cs
		in := pos - idx*r.cs
		n := int(min(int64(len(p)-done), r.cs-in))
		if r.chunks[idx] == nil {
			clear(p[done : done+n])
		} else {
			dst := p[done : done+n]
			if err := r.readChunk(ctx, idx, func(raw []byte) { copy(dst, raw[in:]) }); err != nil {
				r.keepErr(err)
				return 0, err
			}
		}
		done += n
	}
	if done < want {
		return done, io.EOF
	}
	return done, nil
}

func (r *FileReader) keepErr(err error) {
	r.mu.Lock()
	if r.firstErr == nil {
		r.firstErr = err
	}
	r.mu.Unlock()
}

// readChunk calls read with the decoded chunk idx, which read must not
// keep; concurrent readers of one chunk share one decode. A decoded chunk
// is only read under the cache's lock (or by its decoder before it is
// cached), so that the cache can recycle the buffers it evicts.
func (r *FileReader) readChunk(ctx context.Context, idx int64, read func(raw []byte)) error {
	key := decodedKey{file: r.name, idx: idx}
	for {
		if r.s.serving.cache.read(key, read) {
			return nil
		}
		r.mu.Lock()
		if f, ok := r.flights[idx]; ok {
			r.mu.Unlock()
			select {
			case <-f.done:
				if f.err != nil {
					return f.err
				}
				continue // in the cache now, unless evicted already
			case <-ctx.Done():
				return fmt.Errorf("wait for chunk at offset %d of %s (%s): %w", idx*r.cs, r.name, r.chunks[idx].ref.desc.Digest, ctx.Err())
			}
		}
		f := &chunkFlight{done: make(chan struct{})}
		r.flights[idx] = f
		r.mu.Unlock()

		r.s.demand.begin()
		raw, err := r.budgetedDecode(ctx, r.chunks[idx])
		r.s.demand.end()
		if err == nil {
			read(raw)
			r.s.serving.cache.put(key, raw)
		}
		r.mu.Lock()
		delete(r.flights, idx)
		if err == nil && !r.ordered[idx] {
			r.ordered[idx] = true
			r.order = append(r.order, idx)
		}
		r.mu.Unlock()
		f.err = err
		close(f.done)
		return err
	}
}

// budgetedDecode is decode within the snapshot's decode memory budget
// (ReadOptions.MaxMemory): a decode waits, under ctx, until its buffers
// fit beside the others in flight.
func (r *FileReader) budgetedDecode(ctx context.Context, c *servedChunk) ([]byte, error) {
	w := decodeWeight(r.cs, r.s.Encrypted(), c.base != nil, r.s.opts.MaxMemory)
	if err := r.s.serving.budget.Acquire(ctx, w); err != nil {
		return nil, fmt.Errorf("wait for decode memory for chunk at offset %d of %s (%s): %w", c.ref.off, r.name, c.ref.desc.Digest, err)
	}
	defer r.s.serving.budget.Release(w)
	return r.decode(ctx, c)
}

// decode fetches (verified), decrypts and decompresses one chunk, applying
// a delta to its base.
func (r *FileReader) decode(ctx context.Context, c *servedChunk) ([]byte, error) {
	b := r.s.serving.bufs.Get().(*chunkBufs)
	defer r.s.serving.bufs.Put(b)
	cs := r.cs
	ref := c.ref
	b.stored = grow(b.stored, maxStoredSize(cs)+1)
	if r.s.Encrypted() {
		b.scratch = grow(b.scratch, maxStoredSize(cs))
	}
	if c.base != nil {
		b.payload = grow(b.payload, cs)
	}
	fail := func(what string, err error) error {
		return fmt.Errorf("%s chunk at offset %d of %s (%s): %w", what, ref.off, r.name, ref.desc.Digest, err)
	}
	out := r.s.serving.cache.buffer(ref.size, cs)
	ok := false
	defer func() {
		if !ok {
			r.s.serving.cache.release(out)
		}
	}()
	stored, err := fetchVerified(ctx, r.s.store, ref.desc, maxStoredSize(cs), r.s.opts.RangeSize, b.stored)
	if err != nil {
		return nil, fail("fetch", err)
	}
	r.fetched.Add(1)
	r.fetchedBytes.Add(ref.desc.Size)
	if c.base == nil {
		raw, err := r.codec.open(ref.file, ref.off, ref.size, stored, b.scratch, out)
		if err != nil {
			return nil, fail("decode", err)
		}
		ok = true
		return raw, nil
	}
	payload, err := r.codec.openDelta(ref.file, ref.off, ref.size, c.base.desc.Digest, stored, b.scratch, b.payload)
	if err != nil {
		return nil, fail("decode delta", err)
	}
	// payload lives in b.payload; the base goes through b.stored again.
	sb, err := fetchVerified(ctx, r.s.store, c.base.desc, maxStoredSize(cs), r.s.opts.RangeSize, b.stored)
	if err != nil {
		return nil, fail("fetch base "+string(c.base.desc.Digest)+" of", err)
	}
	r.fetched.Add(1)
	r.fetchedBytes.Add(c.base.desc.Size)
	base, err := r.codec.open(ref.file, ref.off, c.base.size, sb, b.scratch, out)
	if err != nil {
		return nil, fail("decode base "+string(c.base.desc.Digest)+" of", err)
	}
	if err := applyDelta(payload, base); err != nil {
		return nil, fail("apply delta", err)
	}
	ok = true
	return base, nil
}

// PrefetchStats reports a prefetch.
type PrefetchStats struct {
	Chunks      int
	StoredBytes int64
	Duration    time.Duration
}

// ensurer is a store that can fill the node cache without reading the
// blob back (nodecache.CachingStore).
type ensurer interface {
	Ensure(ctx context.Context, desc ocispec.Descriptor) error
}

// Prefetch puts every stored blob of the file (chunks, delta bases) into
// the node cache, first the chunks in order (indexes of chunks, e.g. the
// recorded working set; out-of-range and repeated ones are ignored), then
// the rest in offset order, workers at a time. A store without a node
// cache has every blob fetched and verified (and dropped).
//
// A blob the store has lost (IsPermanent: digest mismatch, truncated, not
// found, range not satisfiable) ends the prefetch at once with an error
// naming the chunk and its digest: the guest would fail on its first touch
// of that chunk. Any other failure is transient: the prefetch goes on with
// the other blobs and then retries the failed ones, waiting
// PrefetchRetryMin, doubling up to PrefetchRetryMax, until every blob is
// in or ctx ends (its error then).
func (r *FileReader) Prefetch(ctx context.Context, workers int, order []int64) (PrefetchStats, error) {
	start := time.Now()
	type item struct {
		desc ocispec.Descriptor
		off  int64
		base bool
	}
	var items []item
	seen := map[int64]bool{}
	add := func(idx int64) {
		if seen[idx] || r.chunks[idx] == nil {
			return
		}
		seen[idx] = true
		c := r.chunks[idx]
		items = append(items, item{desc: c.ref.desc, off: c.ref.off})
		if c.base != nil {
			items = append(items, item{desc: c.base.desc, off: c.ref.off, base: true})
		}
	}
	for _, i := range order {
		add(i)
	}
	for _, i := range r.idxs {
		add(i)
	}
	var bytes atomic.Int64
	pending := items
	wait := PrefetchRetryMin
	for attempt := 0; ; attempt++ {
		var mu sync.Mutex
		var failed []item
		var lastErr error
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(max(workers, 1))
		for _, it := range pending {
			if gctx.Err() != nil {
				break
			}
			if err := r.s.demand.quiet(gctx); err != nil {
				break
			}
			g.Go(func() error {
				var err error
				if e, ok := r.s.store.(ensurer); ok {
					err = e.Ensure(gctx, it.desc)
				} else {
					_, err = fetchVerified(gctx, r.s.store, it.desc, maxStoredSize(r.cs), r.s.opts.RangeSize, nil)
				}
				if err == nil {
					bytes.Add(it.desc.Size)
					return nil
				}
				what := "chunk"
				if it.base {
					what = "delta base of chunk"
				}
				err = fmt.Errorf("prefetch %s at offset %d of %s (%s): %w", what, it.off, r.name, it.desc.Digest, err)
				if gctx.Err() == nil && IsPermanent(err) {
					return err
				}
				mu.Lock()
				failed, lastErr = append(failed, it), err
				mu.Unlock()
				return nil
			})
		}
		err := g.Wait()
		if err == nil {
			err = ctx.Err()
		}
		if err != nil || len(failed) == 0 {
			return PrefetchStats{Chunks: len(items), StoredBytes: bytes.Load(), Duration: time.Since(start)}, err
		}
		log.G(ctx).WithError(lastErr).WithFields(log.Fields{"failed": len(failed), "retry_in": wait, "attempt": attempt + 1}).Warn("prefetch: blobs failed; retrying them")
		select {
		case <-ctx.Done():
			return PrefetchStats{Chunks: len(items), StoredBytes: bytes.Load(), Duration: time.Since(start)}, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, PrefetchRetryMax)
		pending = failed
	}
}

// PrefetchRetryMin and PrefetchRetryMax bound the wait before a prefetch
// retries the blobs that failed transiently (doubling from min).
var (
	PrefetchRetryMin = time.Second
	PrefetchRetryMax = time.Minute
)

// IsPermanent reports whether err says a stored blob is lost or wrong,
// which no retry mends: its content does not match its digest or size
// (ErrDataLoss), the store does not have it (ErrNotFound), refuses its
// range (ErrOutOfRange, HTTP 416), or its descriptor is invalid.
func IsPermanent(err error) bool {
	return errors.Is(err, errdefs.ErrDataLoss) || errors.Is(err, errdefs.ErrNotFound) ||
		errors.Is(err, errdefs.ErrOutOfRange) || errors.Is(err, errdefs.ErrInvalidArgument)
}

// demandQuiet is how long no page fault may have waited for a chunk before
// prefetch starts another fetch: a guest that faults wants the link to
// itself (a fault stalls a vCPU, a prefetch only saves a later one).
const demandQuiet = 20 * time.Millisecond

// demandClock says when the guest last waited for a chunk, so that
// prefetch yields to page faults.
type demandClock struct {
	inFlight atomic.Int32
	last     atomic.Int64 // unix nanoseconds
}

func (d *demandClock) begin() { d.inFlight.Add(1) }

func (d *demandClock) end() {
	d.last.Store(time.Now().UnixNano())
	d.inFlight.Add(-1)
}

// quiet waits until no fault has waited for a chunk for demandQuiet.
func (d *demandClock) quiet(ctx context.Context) error {
	for {
		idle := time.Since(time.Unix(0, d.last.Load()))
		if d.inFlight.Load() == 0 && idle >= demandQuiet {
			return nil
		}
		wait := demandQuiet
		if idle < demandQuiet {
			wait = demandQuiet - idle
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}
