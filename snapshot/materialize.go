package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"
)

// Materialized is a snapshot rebuilt as plain sparse files in a cache
// directory. The files are read-only (0400) and must not be modified: QEMU
// maps RAM with share=off and uses disks as backing files of new overlays.
type Materialized struct {
	// Dir is <cacheDir>/<hex of the manifest digest>.
	Dir            string
	ManifestDigest digest.Digest
	// RAM, DevState and Spec are paths, "" when the snapshot has no such
	// file.
	RAM, DevState, Spec string
	// Disks maps a disk name (DiskFile without "disk:") to its image path.
	Disks map[string]string
	// CacheHit is true when Dir already existed and nothing was fetched.
	CacheHit bool
}

// ReadSpec returns the spec file's contents.
func (m *Materialized) ReadSpec() ([]byte, error) {
	if m.Spec == "" {
		return nil, fmt.Errorf("snapshot has no spec: %w", errdefs.ErrNotFound)
	}
	return os.ReadFile(m.Spec)
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

// Materialize rebuilds the snapshot's files under cacheDir/<hex of the
// manifest digest>. Chunks are fetched, verified (digest before anything
// else, then decryption, then a bounded decompression to exactly the
// annotated size) and written at their offsets in parallel, into sparse
// files in a temporary directory inside cacheDir that is renamed into place
// when complete. On any error (disk full included) the temporary directory
// is removed: nothing partial is left, nothing outside cacheDir is written.
// A second call finds the directory and fetches nothing.
func (s *Snapshot) Materialize(ctx context.Context, cacheDir string) (_ *Materialized, retErr error) {
	hexd := s.Descriptor.Digest.Encoded()
	if err := checkDigest(s.Descriptor.Digest); err != nil {
		return nil, err
	}
	if s.Encrypted() && s.opts.DecryptionKey == nil {
		return nil, fmt.Errorf("materialize %s: encrypted snapshot and no decryption key: %w", s.Descriptor.Digest, errdefs.ErrFailedPrecondition)
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("materialize: %w", err)
	}
	final := filepath.Join(cacheDir, hexd)
	if st, err := os.Lstat(final); err == nil && st.IsDir() {
		return s.cached(final, true)
	}
	tmp, err := os.MkdirTemp(cacheDir, ".tmp-"+hexd[:16]+"-")
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
		return nil, fmt.Errorf("materialize %s: %w", s.Descriptor.Digest, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		if st, err2 := os.Lstat(final); err2 == nil && st.IsDir() {
			// Another materialization of the same snapshot won the race.
			os.RemoveAll(tmp)
			return s.cached(final, true)
		}
		return nil, fmt.Errorf("materialize %s: %w", s.Descriptor.Digest, err)
	}
	syncDir(cacheDir)
	return s.cached(final, false)
}

// cached describes the complete directory dir.
func (s *Snapshot) cached(dir string, hit bool) (*Materialized, error) {
	m := &Materialized{Dir: dir, ManifestDigest: s.Descriptor.Digest, Disks: map[string]string{}, CacheHit: hit}
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

func (s *Snapshot) materializeInto(ctx context.Context, dir string) (retErr error) {
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			if err := f.Close(); err != nil && retErr == nil {
				retErr = err
			}
		}
	}()
	for _, fi := range s.Metadata.Files {
		f, err := os.OpenFile(filepath.Join(dir, localName(fi.Name)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
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
	err := s.forEachChunk(ctx, func(c chunkRef, b []byte) error {
		if _, err := writeAt(files[c.file], b, c.off); err != nil {
			return fmt.Errorf("write %s at %d: %w", c.file, c.off, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Delta chunks after the full ones (delta.go): they go to other offsets.
	if err := s.forEachDelta(ctx, func(c chunkRef, b []byte) error {
		if _, err := writeAt(files[c.file], b, c.off); err != nil {
			return fmt.Errorf("write %s at %d: %w", c.file, c.off, err)
		}
		return nil
	}); err != nil {
		return err
	}
	for name, f := range files {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", name, err)
		}
		if err := f.Chmod(0o400); err != nil {
			return err
		}
	}
	syncDir(dir)
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// forEachChunk fetches, verifies, decrypts and decompresses every chunk in
// parallel and calls fn with the raw bytes (valid only during the call).
func (s *Snapshot) forEachChunk(ctx context.Context, fn func(c chunkRef, raw []byte) error) error {
	if s.Encrypted() && s.opts.DecryptionKey == nil {
		return fmt.Errorf("encrypted snapshot and no decryption key: %w", errdefs.ErrFailedPrecondition)
	}
	cs := s.Metadata.ChunkSize
	perWorker := 2*maxStoredSize(cs) + cs
	workers := max(min(s.opts.Workers, int(s.opts.MaxMemory/perWorker)), 1)
	var key []byte
	if s.Encrypted() {
		key = s.opts.DecryptionKey
	}
	codec, err := newChunkCodec(cs, key, 0, workers, false)
	if err != nil {
		return err
	}
	defer codec.Close()
	g, ctx := errgroup.WithContext(ctx)
	jobs := make(chan chunkRef)
	g.Go(func() error {
		defer close(jobs)
		for _, c := range s.chunks {
			select {
			case jobs <- c:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	for range workers {
		g.Go(func() error {
			stored := make([]byte, maxStoredSize(cs)+1)
			scratch := make([]byte, maxStoredSize(cs))
			raw := make([]byte, cs)
			for c := range jobs {
				b, err := fetchVerified(ctx, s.store, c.desc, maxStoredSize(cs), s.opts.RangeSize, stored)
				if err != nil {
					return fmt.Errorf("chunk %s at %d: %w", c.file, c.off, err)
				}
				out, err := codec.open(c.file, c.off, c.size, b, scratch, raw)
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
	return g.Wait()
}

// CachePath returns where Materialize puts the snapshot with manifest
// digest d under cacheDir.
func CachePath(cacheDir string, d digest.Digest) string {
	return filepath.Join(cacheDir, d.Encoded())
}

// PruneTemp removes the temporary directories that materializations
// interrupted by a crash left in cacheDir, when older than olderThan (pick
// more than the longest materialization, e.g. an hour).
func PruneTemp(cacheDir string, olderThan time.Duration) error {
	ents, err := os.ReadDir(cacheDir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("prune %s: %w", cacheDir, err)
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > olderThan {
			errs = append(errs, os.RemoveAll(filepath.Join(cacheDir, e.Name())))
		}
	}
	return errors.Join(errs...)
}
