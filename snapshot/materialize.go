package snapshot

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
)

// Materialized is a snapshot rebuilt as plain sparse files in a cache
// directory. The files are read-only (0400) and must not be modified: QEMU
// maps RAM with share=off and uses disks as backing files of new overlays.
type Materialized struct {
	// Dir is the snapshot's directory (nodecache.Snapshots.Path).
	Dir            string
	ManifestDigest digest.Digest
	// RAM, DevState and Spec are paths, "" when the snapshot has no such
	// file.
	RAM, DevState, Spec string
	// Disks maps a disk name (DiskFile without "disk:") to its image path.
	Disks map[string]string
	// CacheHit is true when Dir already existed and nothing was fetched.
	CacheHit bool

	specLimit int64
}

// ReadSpec returns the spec file's contents (at most ReadOptions.MaxSpecSize
// bytes, never through a symlink).
func (m *Materialized) ReadSpec() ([]byte, error) {
	if m.Spec == "" {
		return nil, fmt.Errorf("snapshot has no spec: %w", errdefs.ErrNotFound)
	}
	d, err := safefs.OpenDir(m.Dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.ReadFile(localName(FileSpec), m.specLimit)
}

// writerAt is what Materialize writes chunks to (an *os.File).
type writerAt interface {
	WriteAt(b []byte, off int64) (int, error)
}

// localName maps a snapshot file name to its name in the cache directory.
// Disk names are validated (no '/', no ".."), and ':' is avoided because
// QEMU's command line gives it a meaning.
func localName(file string) string {
	return strings.Replace(file, diskPrefix, "disk-", 1)
}

// VerifyStats reports what Verify checked.
type VerifyStats struct {
	Chunks      int
	StoredBytes int64
	RawBytes    int64
}

// Verify fetches every chunk and checks its digest, its decryption and its
// decompressed size, without writing anything.
func (s *Snapshot) Verify(ctx context.Context) (VerifyStats, error) {
	var st VerifyStats
	var stored, raw, n atomic.Int64
	count := func(c chunkRef, b []byte) error {
		n.Add(1)
		stored.Add(c.desc.Size)
		raw.Add(int64(len(b)))
		return nil
	}
	err := s.forEachChunk(ctx, count)
	if err == nil {
		err = s.forEachDelta(ctx, count)
	}
	st.Chunks, st.StoredBytes, st.RawBytes = int(n.Load()), stored.Load(), raw.Load()
	if err != nil {
		return st, fmt.Errorf("verify snapshot %s: %w", s.Descriptor.Digest, err)
	}
	return st, nil
}

// Materialize rebuilds the snapshot's files in its directory of the node's
// materialized snapshots, one materialization of a snapshot at a time on
// the node (nodecache.Slot). Chunks are fetched, verified (digest before
// anything else, then decryption, then a bounded decompression to exactly
// the annotated size) and written at their offsets in parallel, into sparse
// files in a temporary directory beside it that is renamed into place when
// complete. On any error (disk full included) the temporary directory is
// removed: nothing partial is left, nothing outside dirs is written. A
// second call finds the directory and fetches nothing.
func (s *Snapshot) Materialize(ctx context.Context, dirs *nodecache.Snapshots) (_ *Materialized, retErr error) {
	if err := stores.CheckDigest(s.Descriptor.Digest); err != nil {
		return nil, err
	}
	if s.Encrypted() && s.opts.DecryptionKey == nil {
		return nil, fmt.Errorf("materialize %s: encrypted snapshot and no decryption key: %w", s.Descriptor.Digest, errdefs.ErrFailedPrecondition)
	}
	// Through the node cache, the lock is per snapshot and store, and the
	// whole materialization (lock wait included) is bounded like a
	// download of all its blobs: a slow store holds up only itself.
	var storeID string
	if b, ok := s.store.(boundedStore); ok {
		storeID = b.StoreID()
		bound := b.DownloadBound(s.storedSize())
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, bound, fmt.Errorf("materialize %s: not done within %s (download_deadline + size / min_download_rate_kib): %w", s.Descriptor.Digest, bound, context.DeadlineExceeded))
		defer cancel()
	}
	slot, err := dirs.LockFor(ctx, s.Descriptor.Digest, storeID)
	if err != nil {
		return nil, fmt.Errorf("materialize: %w", causeOf(ctx, err))
	}
	defer slot.Close()
	hit, err := slot.Complete(ctx)
	if err != nil {
		return nil, fmt.Errorf("materialize %s: %w", s.Descriptor.Digest, err)
	}
	if hit {
		// The directory may come from another tenant's store: it is
		// this one's only if this store holds every blob of the snapshot.
		if err := s.confirmBlobs(ctx); err != nil {
			return nil, fmt.Errorf("materialize %s: materialized on the node, but not confirmed by this store: %w", s.Descriptor.Digest, causeOf(ctx, err))
		}
		return s.cached(slot.Path(), true)
	}
	tmp, err := slot.TempDir()
	if err != nil {
		return nil, fmt.Errorf("materialize: %w", err)
	}
	defer func() {
		if retErr != nil {
			if err := os.RemoveAll(tmp); err != nil {
				log.G(ctx).WithError(err).WithField("dir", tmp).Warn("remove partial materialization")
			}
		}
	}()
	if err := s.materializeInto(ctx, tmp); err != nil {
		return nil, fmt.Errorf("materialize %s: %w", s.Descriptor.Digest, causeOf(ctx, err))
	}
	hit, err = slot.Publish(ctx, tmp)
	if err != nil {
		return nil, fmt.Errorf("materialize %s: %w", s.Descriptor.Digest, err)
	}
	if hit {
		os.RemoveAll(tmp)
	}
	return s.cached(slot.Path(), hit)
}

// boundedStore is the node cache's view of a store (nodecache.CachingStore).
type boundedStore interface {
	StoreID() string
	DownloadBound(size int64) time.Duration
}

// causeOf names the deadline when ctx ran out.
func causeOf(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		if c := context.Cause(ctx); c != nil && c != ctx.Err() {
			return fmt.Errorf("%w (%w)", c, err)
		}
	}
	return err
}

// storedSize is the bytes of every layer of the snapshot.
func (s *Snapshot) storedSize() int64 {
	var n int64
	for _, l := range s.Manifest.Layers {
		if l.Size > 0 {
			n += l.Size
		}
	}
	return n
}

// confirmBlobs asks the store (through the node cache, which remembers
// what each store confirmed) whether it holds the manifest, its config and
// every layer.
func (s *Snapshot) confirmBlobs(ctx context.Context) error {
	descs := append([]ocispec.Descriptor{s.Descriptor, s.Manifest.Config}, s.Manifest.Layers...)
	seen := map[digest.Digest]bool{}
	var todo []ocispec.Descriptor
	for _, d := range descs {
		if d.Digest != "" && !seen[d.Digest] {
			seen[d.Digest] = true
			todo = append(todo, d)
		}
	}
	return inParallel(ctx, todo, 16, func(ctx context.Context, jobs <-chan ocispec.Descriptor) error {
		for d := range jobs {
			ok, err := s.store.Exists(ctx, d)
			if err != nil {
				return fmt.Errorf("blob %s: %w", d.Digest, err)
			}
			if !ok {
				return fmt.Errorf("blob %s not in the store: %w", d.Digest, errdefs.ErrNotFound)
			}
		}
		return nil
	})
}

// cached describes the complete directory dir.
func (s *Snapshot) cached(dir string, hit bool) (*Materialized, error) {
	m := &Materialized{Dir: dir, ManifestDigest: s.Descriptor.Digest, Disks: map[string]string{}, CacheHit: hit, specLimit: s.opts.MaxSpecSize}
	for _, f := range s.Metadata.Files {
		p := filepath.Join(dir, localName(f.Name))
		st, err := os.Lstat(p)
		if err != nil || !st.Mode().IsRegular() || st.Size() != f.Size {
			return nil, fmt.Errorf("materialized %s: %s missing or wrong size, remove %s: %w", s.Descriptor.Digest, f.Name, dir, errdefs.ErrDataLoss)
		}
		switch {
		case f.Name == FileRAM:
			m.RAM = p
		case f.Name == FileDevState:
			m.DevState = p
		case f.Name == FileSpec:
			m.Spec = p
		default:
			m.Disks[strings.TrimPrefix(f.Name, diskPrefix)] = p
		}
	}
	return m, nil
}

func (s *Snapshot) materializeInto(ctx context.Context, path string) (retErr error) {
	dir, err := safefs.OpenDir(path)
	if err != nil {
		return err
	}
	defer dir.Close()
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			if err := f.Close(); err != nil && retErr == nil {
				retErr = err
			}
		}
	}()
	for _, fi := range s.Metadata.Files {
		f, err := dir.OpenFile(localName(fi.Name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		files[fi.Name] = f
		if err := f.Truncate(fi.Size); err != nil {
			return fmt.Errorf("size %s: %w", fi.Name, err)
		}
	}
	writeAt := s.writeAt
	if writeAt == nil {
		writeAt = func(f writerAt, b []byte, off int64) (int, error) { return f.WriteAt(b, off) }
	}
	err = s.forEachChunk(ctx, func(c chunkRef, b []byte) error {
		if err := writeSparse(writeAt, files[c.file], b, c.off); err != nil {
			return fmt.Errorf("write %s at %d: %w", c.file, c.off, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Delta chunks after the full ones (delta.go): they go to other offsets.
	if err := s.forEachDelta(ctx, func(c chunkRef, b []byte) error {
		if err := writeSparse(writeAt, files[c.file], b, c.off); err != nil {
			return fmt.Errorf("write %s at %d: %w", c.file, c.off, err)
		}
		return nil
	}); err != nil {
		return err
	}
	// No fsync: see Materialize.
	for _, f := range files {
		if err := f.Chmod(0o400); err != nil {
			return err
		}
	}
	return nil
}

// forEachChunk fetches, verifies, decrypts and decompresses every chunk in
// parallel and calls fn with the raw bytes (valid only during the call).
func (s *Snapshot) forEachChunk(ctx context.Context, fn func(c chunkRef, raw []byte) error) error {
	cs := s.Metadata.ChunkSize
	codec, key, workers, err := s.readCodec(2*maxStoredSize(cs)+cs, len(s.chunks))
	if err != nil {
		return err
	}
	defer codec.Close()
	return inParallel(ctx, s.chunks, workers, func(ctx context.Context, jobs <-chan chunkRef) error {
		wb := getWorkerBufs(cs, key != nil)
		defer workerBufPool.Put(wb)
		for c := range jobs {
			b, err := fetchVerified(ctx, s.store, c.desc, maxStoredSize(cs), s.opts.RangeSize, wb.stored)
			if err != nil {
				return fmt.Errorf("chunk %s at %d: %w", c.file, c.off, err)
			}
			out, err := codec.open(c.file, c.off, c.size, b, wb.scratch, wb.raw)
			if err != nil {
				return fmt.Errorf("chunk %s at %d (%s): %w", c.file, c.off, c.desc.Digest, err)
			}
			if err := fn(c, out); err != nil {
				return err
			}
		}
		return nil
	})
}

// workerBufs are one forEachChunk worker's buffers: the stored chunk, the
// decrypted one (encrypted snapshots only) and the raw one. They are kept
// between calls (Verify then Materialize, several restores in one process):
// fresh ones cost a page fault per page, in BenchmarkPipeline about a tenth
// of a materialization's CPU time.
type workerBufs struct{ stored, scratch, raw []byte }

var workerBufPool sync.Pool

func getWorkerBufs(chunkSize int64, encrypted bool) *workerBufs {
	wb, _ := workerBufPool.Get().(*workerBufs)
	if wb == nil {
		wb = &workerBufs{}
	}
	grow := func(b []byte, n int64) []byte {
		if int64(cap(b)) < n {
			return make([]byte, n)
		}
		return b[:n]
	}
	wb.stored = grow(wb.stored, maxStoredSize(chunkSize)+1)
	wb.raw = grow(wb.raw, chunkSize)
	if encrypted {
		wb.scratch = grow(wb.scratch, maxStoredSize(chunkSize))
	}
	return wb
}
