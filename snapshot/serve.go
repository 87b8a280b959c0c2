package snapshot

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
)

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
	s      *Snapshot
	name   string
	size   int64
	cs     int64
	chunks []*servedChunk // by index off/cs; nil: a hole
	codec  *chunkCodec

	bufs sync.Pool // *chunkBufs

	mu       sync.Mutex
	decoded  map[int64]*list.Element // of *decodedChunk, by index
	lru      *list.List
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
	idx int64
	raw []byte
}

type chunkFlight struct {
	done chan struct{}
	raw  []byte
	err  error
}

type chunkBufs struct{ stored, scratch, base, payload []byte }

// keepDecoded bounds the decoded chunks a FileReader keeps: a fault cluster
// reads a chunk in max_read pieces (1 MiB), so the chunk it is in is kept
// for the next pieces, not for ever (the page cache is the real cache).
const keepDecoded = 4

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
	r := &FileReader{s: s, name: name, size: size, cs: cs, codec: codec,
		chunks:  make([]*servedChunk, (size+cs-1)/cs),
		decoded: map[int64]*list.Element{}, lru: list.New(), flights: map[int64]*chunkFlight{}, ordered: map[int64]bool{}}
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
	r.bufs.New = func() any {
		return &chunkBufs{stored: make([]byte, maxStoredSize(cs)+1), scratch: make([]byte, maxStoredSize(cs)),
			base: make([]byte, cs), payload: make([]byte, cs)}
	}
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
	for _, c := range r.chunks {
		if c == nil {
			continue
		}
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
			raw, err := r.chunk(ctx, idx)
			if err != nil {
				r.keepErr(err)
				return 0, err
			}
			copy(p[done:done+n], raw[in:])
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

// chunk returns the decoded chunk idx; concurrent readers of one chunk
// share one decode. The returned slice is never modified.
func (r *FileReader) chunk(ctx context.Context, idx int64) ([]byte, error) {
	r.mu.Lock()
	if e, ok := r.decoded[idx]; ok {
		r.lru.MoveToFront(e)
		r.mu.Unlock()
		return e.Value.(*decodedChunk).raw, nil
	}
	if f, ok := r.flights[idx]; ok {
		r.mu.Unlock()
		select {
		case <-f.done:
			return f.raw, f.err
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for chunk at offset %d of %s (%s): %w", idx*r.cs, r.name, r.chunks[idx].ref.desc.Digest, ctx.Err())
		}
	}
	f := &chunkFlight{done: make(chan struct{})}
	r.flights[idx] = f
	r.mu.Unlock()

	r.s.demand.begin()
	f.raw, f.err = r.decode(ctx, r.chunks[idx])
	r.s.demand.end()
	r.mu.Lock()
	delete(r.flights, idx)
	if f.err == nil && !r.ordered[idx] {
		r.ordered[idx] = true
		r.order = append(r.order, idx)
	}
	if f.err == nil {
		r.decoded[idx] = r.lru.PushFront(&decodedChunk{idx: idx, raw: f.raw})
		for r.lru.Len() > keepDecoded {
			old := r.lru.Remove(r.lru.Back()).(*decodedChunk)
			delete(r.decoded, old.idx)
		}
	}
	r.mu.Unlock()
	close(f.done)
	return f.raw, f.err
}

// decode fetches (verified), decrypts and decompresses one chunk, applying
// a delta to its base.
func (r *FileReader) decode(ctx context.Context, c *servedChunk) ([]byte, error) {
	b := r.bufs.Get().(*chunkBufs)
	defer r.bufs.Put(b)
	cs := r.cs
	ref := c.ref
	fail := func(what string, err error) error {
		return fmt.Errorf("%s chunk at offset %d of %s (%s): %w", what, ref.off, r.name, ref.desc.Digest, err)
	}
	out := make([]byte, ref.size)
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
		if idx < 0 || idx >= int64(len(r.chunks)) || seen[idx] || r.chunks[idx] == nil {
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
	for i := range r.chunks {
		add(int64(i))
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
