package snapshot

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"maps"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/cryo-runtime/cryo/internal/tenant"
	"github.com/cryo-runtime/cryo/stores"
)

// WriteOptions tune Write. The zero value writes a plaintext, unsigned
// snapshot with 4 MiB chunks using every core.
type WriteOptions struct {
	// ChunkSize is the raw chunk size: a power of two in [MinChunkSize,
	// MaxChunkSize]; 0 means DefaultChunkSize.
	ChunkSize int64
	// Level is the zstd level (1-22, as the zstd CLI); 0 means 3.
	Level int
	// Workers compress and hash chunks; 0 means GOMAXPROCS.
	Workers int
	// Yield runs the workers at a lower CPU priority (nice YieldNice,
	// each on its own thread), at most GOMAXPROCS-1 of them: a write
	// beside a running guest leaves the CPU to the vCPUs, its own and
	// other sandboxes', and takes longer instead. One processor stays
	// with the process's other goroutines (a FUSE server answering the
	// guest's faults must not wait behind a lowered thread); with one, the
	// write does not yield.
	Yield bool
	// Uploads is the number of concurrent pushes; 0 means 4.
	Uploads int
	// MaxMemory bounds the chunk buffers in flight; 0 means 128 MiB. The
	// zstd encoders add a few MiB per worker on top.
	MaxMemory int64
	// EncryptionKey, when set (32 bytes), encrypts every chunk with
	// AES-256-GCM. With a node-wide key, pass the tenant's key derived
	// from it ([TenantKey]), never the node key itself.
	EncryptionKey []byte
	// Tenant, with EncryptionKey, is the namespace the snapshot is sealed
	// for, recorded as Encryption.Tenant: readers of other namespaces
	// refuse it by name (ReadOptions.Tenant).
	Tenant string
	// Lineage, with EncryptionKey, is the lineage to bind into every
	// chunk (Encryption.Lineage, 32 hex digits). Empty: Base's or an
	// incremental file's parent's when they are sealed with the same key
	// (so their chunks stay valid here), else a new random one.
	Lineage string
	// SigningKey, when set, signs the manifest digest (see Sign).
	SigningKey ed25519.PrivateKey
	// Annotations are added to the manifest.
	Annotations map[string]string
	// AnnotateUploaded records in the metadata's annotations what the
	// write pushed ([AnnotationUploadedBytes]): every chunk is pushed
	// before the config is made, so the figure is exact.
	AnnotateUploaded bool

	// Base is the page index of an earlier snapshot of the same files in
	// the same store (LoadPageIndex). A chunk whose pages mostly match its
	// base there is stored as a delta against it (pages that differ), an
	// unchanged one as its base's blob. Write ignores Base (writes full
	// chunks) when its chunk size, encryption key or StoreID differ, and
	// per chunk when the base is no longer in the store.
	Base *PageIndex
	// IndexPath, when set, is where Write saves the page index of the new
	// snapshot (0600, replaced atomically) after tagging ref: the Base of
	// the next write. A failure to save it is logged, not returned (the
	// snapshot is published); the next write then uses an older index or
	// none, which is safe.
	IndexPath string
	// StoreID names the store in the page index, e.g. its URL without the
	// reference: Base only serves the store it was made for.
	StoreID string
	// noLineage writes an encrypted snapshot as cryo did before format
	// version 3 (no lineage in the AAD): tests of old snapshots only.
	noLineage bool

	// ParentReads, when set, is where the parent chunks of an incremental
	// file (IncrementalSourceFile) are read from to make deltas, e.g. the
	// node cache over the target store, which a lazy restore filled. The
	// target store is still asked whether it has them.
	ParentReads stores.Store
}

// WriteStats reports what Write did.
type WriteStats struct {
	// RawBytes is the logical size of all files.
	RawBytes int64
	// ReadBytes is what was read from the files (holes are not read).
	ReadBytes int64
	// DataBytes is the raw size of the stored (non-zero) chunks.
	DataBytes int64
	// StoredBytes is the size of the snapshot in the store: chunks,
	// config and manifest.
	StoredBytes int64
	// UploadedBytes were pushed; SkippedBytes were already in the store
	// (or earlier in this snapshot).
	UploadedBytes int64
	SkippedBytes  int64
	// Chunks were stored; ZeroChunks were read and all zero; HoleChunks
	// were holes and never read.
	Chunks, ZeroChunks, HoleChunks int
	// UploadedChunks were pushed, SkippedChunks were already there.
	UploadedChunks, SkippedChunks int
	// Deltas of the Chunks were stored as deltas; Bases are the layers
	// they need (already in the store: counted in SkippedBytes).
	Deltas, Bases int
	// Reused chunks of incremental files (IncrementalSourceFile) are their
	// parent's, neither read nor uploaded; ParentMissing chunks were read
	// and stored full because the store no longer has the parent's blobs
	// there (or the parent does not fit the write).
	Reused, ParentMissing int
	// DirtyBytes are the pages of incremental files written since their
	// parent: what changed, which the uploads of their chunks compare to.
	DirtyBytes int64
	Duration   time.Duration
}

// chunkJob is one chunk moving through the pipeline.
type chunkJob struct {
	fileIdx int
	file    string
	off     int64
	raw     *[]byte
	stored  *[]byte
	desc    ocispec.Descriptor
	// entry is the chunk's base in the new page index; base is set when
	// the chunk is a delta against it (deltawrite.go).
	entry, base *pageEntry
	// parent is the parent's chunk at this place of an incremental file
	// when the chunk has written pages (parentwrite.go); inc marks every
	// chunk of an incremental file, which the page index leaves out.
	parent *ChunkDesc
	inc    bool
}

type writer struct {
	store stores.Store
	src   *Source
	// lineage is bound into every sealed chunk ("" for plaintext).
	lineage string
	opts    WriteOptions
	codec   *chunkCodec
	// dcodec decodes parent chunks for deltas of incremental files.
	dcodec *chunkCodec

	rawPool, storedPool *bufPool
	tokens              chan struct{}

	mu      sync.Mutex
	claimed map[string]bool // digests pushed (or being pushed) by this write
	layers  []chunkJob
	perFile []int

	// base is opts.Base when it fits the write; hashPages is set when the
	// writer hashes pages (for base or opts.IndexPath). existing caches
	// whether base chunks are in the store; bases are the base layers.
	base      *PageIndex
	hashPages bool
	existing  map[string]bool
	bases     map[string]ocispec.Descriptor
	deltas    atomic.Int64

	readBytes, dataBytes, storedBytes, uploadedBytes, skippedBytes atomic.Int64
	zero, uploadedN, skippedN                                      atomic.Int64
	reused, parentMissing, dirtyBytes                              atomic.Int64
}

// Write snapshots src into store under ref and returns the manifest
// descriptor. It streams: at most opts.MaxMemory of chunk buffers are in
// flight whatever the size of the files, chunks are compressed and hashed by
// opts.Workers goroutines and pushed by opts.Uploads. Chunks the store
// already has are not pushed again. The chunks, config, manifest and
// signature are pushed first and ref is tagged last, so a reader never sees a
// partial snapshot. On error nothing is tagged (pushed blobs stay for GC).
func Write(ctx context.Context, store stores.Store, ref string, src *Source, opts WriteOptions) (ocispec.Descriptor, WriteStats, error) {
	start := time.Now()
	if ref == "" || strings.Contains(ref, "@") {
		return ocispec.Descriptor{}, WriteStats{}, fmt.Errorf("write snapshot %q: ref must be a tag: %w", ref, errdefs.ErrInvalidArgument)
	}
	w, err := newWriter(store, src, opts)
	if err != nil {
		return ocispec.Descriptor{}, WriteStats{}, fmt.Errorf("write snapshot %s: %w", ref, err)
	}
	defer w.codec.Close()
	if w.dcodec != nil {
		defer w.dcodec.Close()
	}
	w.useBase(ctx)
	if err := w.chunks(ctx); err != nil {
		return ocispec.Descriptor{}, WriteStats{}, fmt.Errorf("write snapshot %s: %w", ref, err)
	}
	desc, err := w.publish(ctx, ref)
	if err != nil {
		return ocispec.Descriptor{}, WriteStats{}, fmt.Errorf("write snapshot %s: %w", ref, err)
	}
	w.saveIndex(ctx, desc)
	st := w.stats()
	st.Duration = time.Since(start)
	log.G(ctx).WithFields(log.Fields{"ref": ref, "digest": desc.Digest, "raw": st.RawBytes,
		"stored": st.StoredBytes, "uploaded": st.UploadedBytes, "chunks": st.Chunks,
		"reused": st.Reused, "parent_missing": st.ParentMissing, "duration": st.Duration}).Debug("snapshot written")
	return desc, st, nil
}

func newWriter(store stores.Store, src *Source, opts WriteOptions) (*writer, error) {
	if opts.ChunkSize == 0 {
		opts.ChunkSize = DefaultChunkSize
	}
	if err := checkChunkSize(opts.ChunkSize); err != nil {
		return nil, err
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	opts.Workers, opts.Yield = yielding(opts.Workers, opts.Yield, runtime.GOMAXPROCS(0))
	if opts.Uploads <= 0 {
		opts.Uploads = 4
	}
	if opts.MaxMemory <= 0 {
		opts.MaxMemory = 128 << 20
	}
	level := zstd.SpeedDefault
	if opts.Level > 0 {
		level = zstd.EncoderLevelFromZstd(opts.Level)
	}
	seen := map[string]bool{}
	incremental := false
	for _, f := range src.Files {
		incremental = incremental || f.parent != nil
		if err := validFileName(f.Name); err != nil {
			return nil, err
		}
		if seen[f.Name] {
			return nil, fmt.Errorf("file %s twice: %w", f.Name, errdefs.ErrInvalidArgument)
		}
		seen[f.Name] = true
		if f.Size < 0 || f.ReaderAt == nil {
			return nil, fmt.Errorf("file %s: no reader or negative size: %w", f.Name, errdefs.ErrInvalidArgument)
		}
	}
	if opts.EncryptionKey != nil {
		if opts.Tenant != "" {
			if err := tenant.CheckNamespace(opts.Tenant); err != nil {
				return nil, fmt.Errorf("tenant: %w", err)
			}
		}
		if opts.Lineage != "" {
			if err := checkLineage(opts.Lineage); err != nil {
				return nil, err
			}
		}
		for _, c := range src.Metadata.Containers {
			if len(c.Spec) > 0 {
				return nil, fmt.Errorf("container %s: spec would be stored in clear in an encrypted snapshot, put it in the spec file: %w", c.ID, errdefs.ErrInvalidArgument)
			}
		}
	}
	codec, err := newChunkCodec(opts.ChunkSize, opts.EncryptionKey, level, opts.Workers, true)
	if err != nil {
		return nil, err
	}
	// A job holds a raw and a stored buffer; encrypting workers also hold a
	// scratch buffer each.
	perJob := opts.ChunkSize + maxStoredSize(opts.ChunkSize)
	budget := opts.MaxMemory
	if opts.EncryptionKey != nil {
		budget -= int64(opts.Workers) * maxStoredSize(opts.ChunkSize)
	}
	if opts.Base != nil || opts.IndexPath != "" {
		budget -= int64(opts.Workers) * opts.ChunkSize // delta payloads
	}
	var dcodec *chunkCodec
	if incremental {
		// parentScratch: a parent chunk stored and decoded, a payload.
		budget -= int64(opts.Workers) * (2*maxStoredSize(opts.ChunkSize) + 2*opts.ChunkSize)
		if dcodec, err = newChunkCodec(opts.ChunkSize, opts.EncryptionKey, level, opts.Workers, false); err != nil {
			codec.Close()
			return nil, err
		}
	}
	inflight := max(int(budget/perJob), 1)
	w := &writer{store: store, src: src, opts: opts, codec: codec, dcodec: dcodec,
		tokens: make(chan struct{}, inflight), claimed: map[string]bool{}, perFile: make([]int, len(src.Files)),
		existing: map[string]bool{}, bases: map[string]ocispec.Descriptor{},
		rawPool: newBufPool(inflight, opts.ChunkSize), storedPool: newBufPool(inflight, maxStoredSize(opts.ChunkSize))}
	w.lineage = w.chooseLineage()
	codec.lineage = w.lineage
	if dcodec != nil {
		dcodec.lineage = w.lineage
	}
	return w, nil
}

func checkChunkSize(cs int64) error {
	if cs < MinChunkSize || cs > MaxChunkSize || cs&(cs-1) != 0 {
		return fmt.Errorf("chunk size %d: want a power of two in [%d, %d]: %w", cs, MinChunkSize, MaxChunkSize, errdefs.ErrInvalidArgument)
	}
	return nil
}

// chunks runs the pipeline: read -> compress/encrypt/hash -> push.
func (w *writer) chunks(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	jobs := make(chan *chunkJob)
	pushes := make(chan *chunkJob)
	g.Go(func() error {
		defer close(jobs)
		return w.read(ctx, jobs)
	})
	var workers sync.WaitGroup
	for range w.opts.Workers {
		workers.Add(1)
		g.Go(func() error {
			defer workers.Done()
			return w.compress(ctx, jobs, pushes)
		})
	}
	go func() { workers.Wait(); close(pushes) }()
	for range w.opts.Uploads {
		g.Go(func() error { return w.push(ctx, pushes) })
	}
	return g.Wait()
}

func (w *writer) read(ctx context.Context, jobs chan<- *chunkJob) error {
	for i, f := range w.src.Files {
		var err error
		if f.parent != nil {
			err = w.readIncremental(ctx, i, f, jobs)
		} else {
			err = f.chunkIndexes(w.opts.ChunkSize, func(idx int64) error {
				_, err := w.readChunk(ctx, i, f, idx, nil, jobs)
				return err
			})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readChunk reads chunk idx of file i and, unless it is all zeros, hands
// it to the compress workers (stored); parent is set for a written chunk
// of an incremental file that has a parent chunk there.
func (w *writer) readChunk(ctx context.Context, i int, f SourceFile, idx int64, parent *ChunkDesc, jobs chan<- *chunkJob) (stored bool, err error) {
	cs := w.opts.ChunkSize
	select {
	case w.tokens <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	off := idx * cs
	raw := w.rawPool.get()
	n := min(cs, f.Size-off)
	got, err := f.ReaderAt.ReadAt((*raw)[:n], off)
	if int64(got) == n {
		err = nil
	}
	if err != nil {
		w.release(raw, nil)
		return false, fmt.Errorf("read %s at %d: %w", f.Name, off, err)
	}
	w.readBytes.Add(n)
	if isZero((*raw)[:n]) {
		w.zero.Add(1)
		w.release(raw, nil)
		return false, nil
	}
	*raw = (*raw)[:n]
	select {
	case jobs <- &chunkJob{fileIdx: i, file: f.Name, off: off, raw: raw, parent: parent, inc: f.parent != nil}:
		return true, nil
	case <-ctx.Done():
		w.release(raw, nil)
		return false, ctx.Err()
	}
}

// release returns buffers to their pools and frees one in-flight slot.
func (w *writer) release(raw, stored *[]byte) {
	if raw != nil {
		w.rawPool.put(raw)
	}
	if stored != nil {
		w.storedPool.put(stored)
	}
	<-w.tokens
}

func (w *writer) compress(ctx context.Context, jobs <-chan *chunkJob, pushes chan<- *chunkJob) error {
	w.yield(ctx)
	var scratch []byte
	if w.codec.aead != nil {
		scratch = make([]byte, maxStoredSize(w.opts.ChunkSize))
	}
	var ds *deltaScratch
	if w.hashPages {
		ds = newDeltaScratch(w.opts.ChunkSize)
	}
	var ps *parentScratch
	for j := range jobs {
		rawLen := int64(len(*j.raw))
		done := false
		switch {
		case j.parent != nil:
			if ps == nil {
				ps = newParentScratch(w.opts.ChunkSize)
			}
			done = w.fromParent(ctx, j, ps, scratch)
		case ds != nil && !j.inc:
			done = w.incremental(ctx, j, ds, scratch)
		}
		if !done {
			j.stored = w.storedPool.get()
			out := w.codec.seal(j.file, j.off, *j.raw, scratch, *j.stored)
			*j.stored = out
			j.desc = placedDesc(ocispec.Descriptor{MediaType: w.codec.mediaType(), Digest: sha256Digest(out), Size: int64(len(out))}, j.file, j.off, rawLen)
			if ds != nil && !j.inc {
				j.entry = newPageEntry(j.desc, rawLen, ds.hashes)
			}
		}
		w.rawPool.put(j.raw)
		j.raw = nil
		w.dataBytes.Add(rawLen)
		select {
		case pushes <- j:
		case <-ctx.Done():
			w.release(nil, j.stored)
			return ctx.Err()
		}
	}
	return nil
}

func (w *writer) push(ctx context.Context, pushes <-chan *chunkJob) error {
	for j := range pushes {
		err := w.pushChunk(ctx, j)
		w.release(nil, j.stored)
		j.stored = nil
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *writer) pushChunk(ctx context.Context, j *chunkJob) error {
	d := j.desc.Digest.String()
	w.mu.Lock()
	dup := w.claimed[d]
	w.claimed[d] = true
	w.layers = append(w.layers, chunkJob{fileIdx: j.fileIdx, off: j.off, desc: j.desc, entry: j.entry, base: j.base})
	w.perFile[j.fileIdx]++
	if j.base != nil {
		w.addBase(j.base)
	}
	w.mu.Unlock()
	w.storedBytes.Add(j.desc.Size)
	uploaded := false
	// A chunk without stored bytes is its base's blob, known to be there.
	if !dup && j.stored != nil {
		var err error
		if uploaded, err = pushIfMissing(ctx, w.store, j.desc, *j.stored); err != nil {
			return fmt.Errorf("chunk %s at %d: %w", j.file, j.off, err)
		}
	}
	if uploaded {
		w.uploadedBytes.Add(j.desc.Size)
		w.uploadedN.Add(1)
	} else {
		w.skippedBytes.Add(j.desc.Size)
		w.skippedN.Add(1)
	}
	return nil
}

// publish pushes the config, the manifest and the signature, then tags ref.
func (w *writer) publish(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	sort.Slice(w.layers, func(a, b int) bool {
		la, lb := w.layers[a], w.layers[b]
		if la.fileIdx != lb.fileIdx {
			return la.fileIdx < lb.fileIdx
		}
		return la.off < lb.off
	})
	md := w.src.Metadata
	md.FormatVersion = FormatVersionNoDelta
	if w.deltas.Load() > 0 {
		md.FormatVersion = FormatVersionDelta
	}
	if md.Created.IsZero() {
		md.Created = time.Now().UTC().Truncate(time.Second)
	}
	md.ChunkSize = w.opts.ChunkSize
	md.Compression = compressionZstd
	md.Encryption = nil
	if w.opts.EncryptionKey != nil {
		md.Encryption = &Encryption{Algorithm: algAES256GCM, KeyID: KeyID(w.opts.EncryptionKey), Tenant: w.opts.Tenant, Lineage: w.lineage}
		if w.lineage != "" {
			md.FormatVersion = FormatVersionLineage
		} else {
			md.Encryption.Tenant = ""
		}
	}
	if w.opts.AnnotateUploaded {
		// A copy: the caller's Source keeps its own map.
		md.Annotations = maps.Clone(md.Annotations)
		if md.Annotations == nil {
			md.Annotations = map[string]string{}
		}
		md.Annotations[AnnotationUploadedBytes] = strconv.FormatInt(w.uploadedBytes.Load(), 10)
	}
	md.Files = make([]FileInfo, len(w.src.Files))
	md.Totals = Totals{DataBytes: w.dataBytes.Load(), StoredBytes: w.storedBytes.Load(), Chunks: len(w.layers),
		Deltas: int(w.deltas.Load()), Bases: len(w.bases)}
	for i, f := range w.src.Files {
		md.Files[i] = FileInfo{Name: f.Name, Size: f.Size, Chunks: w.perFile[i]}
		md.Totals.RawBytes += f.Size
	}
	cfg, err := json.Marshal(md)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	cfgDesc := ocispec.Descriptor{MediaType: MediaTypeConfig, Digest: sha256Digest(cfg), Size: int64(len(cfg))}
	layers := make([]ocispec.Descriptor, len(w.layers), len(w.layers)+len(w.bases))
	for i, l := range w.layers {
		layers[i] = l.desc
	}
	layers = append(layers, w.baseLayers()...)
	ann := map[string]string{ocispec.AnnotationCreated: md.Created.Format(time.RFC3339)}
	for k, v := range w.opts.Annotations {
		ann[k] = v
	}
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: ArtifactType,
		Config: cfgDesc, Layers: layers, Annotations: ann}
	m.SchemaVersion = 2
	mb, err := json.Marshal(m)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: ArtifactType,
		Digest: sha256Digest(mb), Size: int64(len(mb))}
	for _, b := range []struct {
		d ocispec.Descriptor
		b []byte
	}{{cfgDesc, cfg}, {desc, mb}} {
		up, err := pushIfMissing(ctx, w.store, b.d, b.b)
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		w.storedBytes.Add(b.d.Size)
		if up {
			w.uploadedBytes.Add(b.d.Size)
		} else {
			w.skippedBytes.Add(b.d.Size)
		}
	}
	if w.opts.SigningKey != nil {
		if err := Sign(ctx, w.store, desc, w.opts.SigningKey); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	if err := w.store.Tag(ctx, desc, ref); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("tag: %w", err)
	}
	return desc, nil
}

func (w *writer) stats() WriteStats {
	var raw int64
	slots := 0
	for _, f := range w.src.Files {
		raw += f.Size
		slots += int((f.Size + w.opts.ChunkSize - 1) / w.opts.ChunkSize)
	}
	zero := int(w.zero.Load())
	return WriteStats{RawBytes: raw, ReadBytes: w.readBytes.Load(), DataBytes: w.dataBytes.Load(),
		StoredBytes: w.storedBytes.Load(), UploadedBytes: w.uploadedBytes.Load(), SkippedBytes: w.skippedBytes.Load(),
		Chunks: len(w.layers), ZeroChunks: zero, HoleChunks: slots - len(w.layers) - zero,
		UploadedChunks: int(w.uploadedN.Load()), SkippedChunks: int(w.skippedN.Load()),
		Deltas: int(w.deltas.Load()), Bases: len(w.bases),
		Reused: int(w.reused.Load()), ParentMissing: int(w.parentMissing.Load()), DirtyBytes: w.dirtyBytes.Load()}
}

// chooseLineage is the lineage the write seals with: WriteOptions.Lineage,
// else the page index's or a parent's when sealed with this key (their
// chunks are reused or made deltas against), else a new one.
func (w *writer) chooseLineage() string {
	if w.opts.EncryptionKey == nil || w.opts.noLineage {
		return ""
	}
	if w.opts.Lineage != "" {
		return w.opts.Lineage
	}
	id := w.keyID()
	if b := w.opts.Base; b != nil && b.lineage != "" && b.keyID == id {
		return b.lineage
	}
	for _, f := range w.src.Files {
		if p := f.parent; p != nil && p.Lineage != "" && p.KeyID == id {
			return p.Lineage
		}
	}
	return NewLineage()
}
