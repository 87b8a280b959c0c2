package bench

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// chunk is one stored chunk of a snapshot, in memory.
type chunk struct {
	stored, raw []byte
}

// pipeline: the restore pipeline (open, fetch into a fresh node cache,
// verify, decompress, write the sparse files: snapshot.Materialize through
// nodecache.CachingStore, as the shim runs it) against raw SHA-256 of the same
// raw bytes and raw zstd decoding of the same stored chunks, each on
// GOMAXPROCS goroutines. All three are reported as raw (decompressed,
// non-zero) MiB per second.
func (r *runner) pipeline() error {
	ctx := r.ctx
	store, ref, err := stores.Open(ctx, r.large, r.s.Cfg.Stores.FetchOptions())
	if err != nil {
		return err
	}
	ropts, err := r.s.Cfg.Snapshot.ReadOptions("")
	if err != nil {
		return err
	}
	snap, err := snapshot.Open(ctx, store, ref, ropts)
	if err != nil {
		return err
	}
	workers := runtime.GOMAXPROCS(0)
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(workers))
	if err != nil {
		return err
	}
	defer dec.Close()
	chunks, rawBytes, err := decodedChunks(ctx, store, snap, dec, workers)
	if err != nil {
		return err
	}

	var shaRate, zstdRate, writeRate, pipeRate, matRate, shmRate []float64
	rate := func(d time.Duration) float64 { return mib(rawBytes) / d.Seconds() }
	dir, err := os.MkdirTemp(r.s.Dir, "pipeline-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	shm, err := os.MkdirTemp(r.s.MemoryDir, "pipeline-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(shm)
	if r.o.CPUProfile != "" {
		f, err := os.Create(r.o.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	for i := range r.o.Runs {
		quiesce()
		t0 := time.Now()
		_ = parallel(chunks, workers, func(c *chunk, _ []byte) error { sha256.Sum256(c.raw); return nil })
		shaRate = append(shaRate, rate(time.Since(t0)))

		t0 = time.Now()
		if err := parallel(chunks, workers, func(c *chunk, buf []byte) error {
			_, err := dec.DecodeAll(c.stored, buf[:0])
			return err
		}); err != nil {
			return err
		}
		zstdRate = append(zstdRate, rate(time.Since(t0)))

		quiesce()
		t0 = time.Now()
		if err := writeRaw(chunks, workers, filepath.Join(dir, "raw")); err != nil {
			return err
		}
		writeRate = append(writeRate, rate(time.Since(t0)))

		quiesce()
		total, matOnly, err := materialize(ctx, store, ref, ropts, filepath.Join(dir, strconv.Itoa(i)))
		if err != nil {
			return err
		}
		pipeRate = append(pipeRate, rate(total))
		matRate = append(matRate, rate(matOnly))
		quiesce()
		total, _, err = materialize(ctx, store, ref, ropts, filepath.Join(shm, strconv.Itoa(i)))
		if err != nil {
			return err
		}
		shmRate = append(shmRate, rate(total))
	}
	r.r.add("pipeline", "snapshot_raw_nonzero", "MiB", mib(rawBytes))
	r.r.add("pipeline", "raw_sha256", "MiB/s", shaRate...)
	r.r.add("pipeline", "raw_zstd_decode", "MiB/s", zstdRate...)
	r.r.add("pipeline", "raw_write", "MiB/s", writeRate...)
	r.r.add("pipeline", "fetch_verify_materialize", "MiB/s", pipeRate...)
	r.r.add("pipeline", "materialize_from_node_cache", "MiB/s", matRate...)
	r.r.add("pipeline", "fetch_verify_materialize_tmpfs", "MiB/s", shmRate...)
	r.progress("pipeline: %.0f MiB/s (blobs already cached: %.0f MiB/s; on tmpfs: %.0f MiB/s); raw sha256 %.0f MiB/s, raw zstd decode %.0f MiB/s, raw write %.0f MiB/s (%d workers, %.0f MiB)",
		Median(pipeRate), Median(matRate), Median(shmRate), Median(shaRate), Median(zstdRate), Median(writeRate), workers, mib(rawBytes))
	return nil
}

// decodedChunks loads the snapshot's stored chunks into memory and decodes
// each once, untimed: the raw bytes SHA-256 runs on.
func decodedChunks(ctx context.Context, store stores.Store, snap *snapshot.Snapshot, dec *zstd.Decoder, workers int) ([]*chunk, int64, error) {
	chunks, rawBytes, err := loadChunks(ctx, store, snap.Manifest.Layers)
	if err != nil {
		return nil, 0, err
	}
	if err := parallel(chunks, workers, func(c *chunk, _ []byte) error {
		var err error
		c.raw, err = dec.DecodeAll(c.stored, make([]byte, 0, len(c.stored)*2))
		return err
	}); err != nil {
		return nil, 0, fmt.Errorf("decode chunks: %w", err)
	}
	return chunks, rawBytes, nil
}

// materialize runs the shim's restore data path once into a fresh node
// cache under dir and returns how long it took; then, the blobs now in the
// cache, it materializes again into a fresh directory (decompress and write
// only) and returns that time too.
func materialize(ctx context.Context, store stores.Store, ref string, ropts snapshot.ReadOptions, dir string) (total, matOnly time.Duration, err error) {
	defer os.RemoveAll(dir)
	cache, err := nodecache.OpenBlobs(filepath.Join(dir, "blobs"), 64<<30)
	if err != nil {
		return 0, 0, err
	}
	for i, out := range []string{"snapshots", "again"} {
		t0 := time.Now()
		snap, err := snapshot.Open(ctx, nodecache.NewCachingStore(store, cache, nodecache.CachingOptions{}), ref, ropts)
		if err != nil {
			return 0, 0, err
		}
		if _, err := snap.Materialize(ctx, nodecache.OpenSnapshots(filepath.Join(dir, out))); err != nil {
			return 0, 0, err
		}
		if i == 0 {
			total = time.Since(t0)
		} else {
			matOnly = time.Since(t0)
		}
	}
	return total, matOnly, nil
}

// loadChunks reads every zstd chunk of a snapshot into memory.
func loadChunks(ctx context.Context, store stores.Store, layers []ocispec.Descriptor) ([]*chunk, int64, error) {
	var out []*chunk
	var raw int64
	for _, l := range layers {
		if l.MediaType != snapshot.MediaTypeChunk {
			continue
		}
		n, err := strconv.ParseInt(l.Annotations[snapshot.AnnotationSize], 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("chunk %s: size annotation: %w", l.Digest, err)
		}
		rc, err := store.Fetch(ctx, l, 0, l.Size)
		if err != nil {
			return nil, 0, err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, 0, err
		}
		raw += n
		out = append(out, &chunk{stored: b})
	}
	if len(out) == 0 {
		return nil, 0, fmt.Errorf("snapshot has no plaintext zstd chunks")
	}
	return out, raw, nil
}

// parallel calls fn for every chunk on n goroutines, each with its own
// chunk-sized buffer.
func parallel(chunks []*chunk, n int, fn func(c *chunk, buf []byte) error) error {
	jobs := make(chan *chunk)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, snapshot.MaxChunkSize)
			for c := range jobs {
				if err := fn(c, buf); err != nil {
					errs <- err
					for range jobs {
					}
					return
				}
			}
		}()
	}
	for _, c := range chunks {
		jobs <- c
	}
	close(jobs)
	wg.Wait()
	close(errs)
	return <-errs
}

// writeRaw writes the raw chunks into a new file on n goroutines, as
// Materialize writes its files (into the page cache, no fsync), then
// removes it.
func writeRaw(chunks []*chunk, n int, path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	defer f.Close()
	var stride int64
	for _, c := range chunks {
		stride = max(stride, int64(len(c.raw)))
	}
	idx := make(map[*chunk]int64, len(chunks))
	for i, c := range chunks {
		idx[c] = int64(i) * stride
	}
	return parallel(chunks, n, func(c *chunk, _ []byte) error {
		_, err := f.WriteAt(c.raw, idx[c])
		return err
	})
}
