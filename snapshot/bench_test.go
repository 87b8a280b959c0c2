package snapshot

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
)

// discardStore hashes and drops pushed blobs: the Write benchmark measures
// the pipeline, not an in-memory store's allocations.
type discardStore struct{ *memStore }

func (d discardStore) Push(_ context.Context, desc ocispec.Descriptor, r io.Reader) error {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err == nil && n != desc.Size {
		err = fmt.Errorf("push %s: %d bytes", desc.Digest, n)
	}
	d.pushes.Add(1)
	d.pushedBytes.Add(n)
	return err
}

// Tag accepts manifests the store never kept.
func (d discardStore) Tag(context.Context, ocispec.Descriptor, string) error { return nil }

// Benchmarks run on a generated RAM-like file: 20% random chunks, 30%
// text-like chunks, 50% zeros (half holes, half written zeros), 4 MiB
// chunks. Its size is 1 GiB unless -benchsize or CRYO_BENCH_SIZE (e.g.
// "64MiB") says otherwise:
//
//	CRYO_BENCH_SIZE=64MiB go test -run '^$' -bench . ./snapshot/
//	go test -run '^$' -bench . -benchtime 1x ./snapshot/    # 1 GiB
var benchSizeFlag = flag.String("benchsize", "", "size of the benchmark file (e.g. 64MiB, 1GiB); default $CRYO_BENCH_SIZE or 1GiB")

var bench struct {
	once  sync.Once
	dir   string
	path  string
	size  int64
	err   error
	store *memStore // holds the snapshot "v1" of path
	first WriteStats
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if bench.dir != "" {
		os.RemoveAll(bench.dir)
	}
	if pipelineBench.dir != "" {
		os.RemoveAll(pipelineBench.dir)
	}
	os.Exit(code)
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	for suf, m := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if v, ok := strings.CutSuffix(s, suf); ok {
			s, mult = v, m
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}

// benchFile creates the benchmark file once.
func benchFile(b *testing.B) (string, int64) {
	bench.once.Do(func() {
		s := *benchSizeFlag
		if s == "" {
			s = os.Getenv("CRYO_BENCH_SIZE")
		}
		if s == "" {
			s = "1GiB"
		}
		if bench.size, bench.err = parseSize(s); bench.err != nil {
			return
		}
		if bench.dir, bench.err = os.MkdirTemp("", "cryo-bench-"); bench.err != nil {
			return
		}
		bench.path = filepath.Join(bench.dir, "ram")
		bench.err = writeBenchFile(bench.path, bench.size)
	})
	if bench.err != nil {
		b.Fatalf("benchmark file: %v", bench.err)
	}
	return bench.path, bench.size
}

// benchKind returns what chunk i of the benchmark file holds: 0 random,
// 1 text, 2 hole, 3 zeros. Chunks are shuffled deterministically.
func benchKind(i int64) int {
	r := rand.New(rand.NewPCG(uint64(i), 99)).IntN(100)
	switch {
	case r < 20:
		return 0
	case r < 50:
		return 1
	case r < 75:
		return 2
	}
	return 3
}

func writeBenchFile(path string, size int64) error {
	r := rand.New(rand.NewPCG(1, 2))
	return writeChunked(path, size, func(i int64, b []byte) bool {
		switch benchKind(i) {
		case 0:
			fillRandom(r, b)
		case 1:
			textLike(r, b)
		case 2:
			return false
		case 3:
			clear(b)
		}
		return true
	})
}

// writeChunked writes a sparse file of size bytes chunk by chunk: fill
// fills chunk i's bytes and reports whether to write them (else the chunk
// stays a hole).
func writeChunked(path string, size int64, fill func(i int64, b []byte) bool) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return err
	}
	const cs = DefaultChunkSize
	buf := make([]byte, cs)
	for i := int64(0); i*cs < size; i++ {
		b := buf[:min(cs, size-i*cs)]
		if !fill(i, b) {
			continue
		}
		if _, err := f.WriteAt(b, i*cs); err != nil {
			return err
		}
	}
	return f.Sync()
}

// peakHeap samples the heap in use until stop is called and returns the
// peak in MiB above the live heap at the start (the benchmark's in-memory
// store), garbage not yet collected included.
func peakHeap() (stop func() float64) {
	var peak atomic.Uint64
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(done)
		<-finished
		return float64(peak.Load()-min(peak.Load(), base.HeapInuse)) / (1 << 20)
	}
}

func writeBench(b *testing.B, store stores.Store, ref, path string) WriteStats {
	return writeBenchOpts(b, store, ref, path, WriteOptions{})
}

func writeBenchOpts(b *testing.B, store stores.Store, ref, path string, opts WriteOptions) WriteStats {
	src, err := NewSource(Metadata{}, SourcePaths{RAM: path})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	_, st, err := Write(context.Background(), store, ref, src, opts)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// benchStore returns a store holding the snapshot "v1" of the bench file.
func benchStore(b *testing.B) *memStore {
	path, _ := benchFile(b)
	if bench.store == nil {
		bench.store = newMemStore()
		bench.first = writeBench(b, bench.store, "v1", path)
	}
	return bench.store
}

func BenchmarkWrite(b *testing.B) {
	path, size := benchFile(b)
	b.SetBytes(size)
	stop := peakHeap()
	var st WriteStats
	for b.Loop() {
		st = writeBench(b, discardStore{newMemStore()}, "v1", path)
	}
	b.ReportMetric(stop(), "peak-heap-MiB")
	b.ReportMetric(float64(st.StoredBytes)/float64(st.RawBytes), "stored/raw")
	b.ReportMetric(float64(st.StoredBytes)/float64(st.DataBytes), "stored/nonzero")
}

// BenchmarkWriteEncrypted is BenchmarkWrite with AES-256-GCM chunks.
func BenchmarkWriteEncrypted(b *testing.B) {
	path, size := benchFile(b)
	b.SetBytes(size)
	stop := peakHeap()
	opts := WriteOptions{EncryptionKey: make([]byte, 32)}
	for b.Loop() {
		writeBenchOpts(b, discardStore{newMemStore()}, "v1", path, opts)
	}
	b.ReportMetric(stop(), "peak-heap-MiB")
}

// forDataChunks calls fn for each non-zero chunk of the bench file, in
// parallel on GOMAXPROCS goroutines, as Write reads them.
func forDataChunks(b *testing.B, fn func(raw, scratch []byte)) {
	path, size := benchFile(b)
	sf, err := OpenSourceFile(FileRAM, path)
	if err != nil {
		b.Fatal(err)
	}
	defer sf.ReaderAt.(*os.File).Close()
	var g errgroup.Group
	idx := make(chan int64)
	for range runtime.GOMAXPROCS(0) {
		g.Go(func() error {
			buf := make([]byte, DefaultChunkSize)
			scratch := make([]byte, maxStoredSize(DefaultChunkSize))
			for i := range idx {
				n, err := sf.ReaderAt.ReadAt(buf[:min(DefaultChunkSize, size-i*DefaultChunkSize)], i*DefaultChunkSize)
				if err != nil && n == 0 {
					return err
				}
				if !isZero(buf[:n]) {
					fn(buf[:n], scratch)
				}
			}
			return nil
		})
	}
	sf.chunkIndexes(DefaultChunkSize, func(i int64) error { idx <- i; return nil })
	close(idx)
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkRawSHA256(b *testing.B) {
	_, size := benchFile(b)
	b.SetBytes(size)
	for b.Loop() {
		forDataChunks(b, func(raw, _ []byte) { sha256.Sum256(raw) })
	}
}

func BenchmarkRawZstdEncode(b *testing.B) {
	_, size := benchFile(b)
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)))
	defer enc.Close()
	b.SetBytes(size)
	for b.Loop() {
		forDataChunks(b, func(raw, dst []byte) { enc.EncodeAll(raw, dst[:0]) })
	}
}

// benchCacheDir is where BenchmarkMaterialize writes: $CRYO_BENCH_CACHE
// (e.g. /dev/shm, to leave the disk out) or the benchmark's temp dir.
func benchCacheDir(b *testing.B) string {
	d := os.Getenv("CRYO_BENCH_CACHE")
	if d == "" {
		return bench.dir
	}
	d, err := os.MkdirTemp(d, "cryo-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func BenchmarkMaterialize(b *testing.B) {
	store := benchStore(b)
	_, size := benchFile(b)
	s, err := Open(context.Background(), store, "v1", ReadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	stop := peakHeap()
	for b.Loop() {
		cache := filepath.Join(benchCacheDir(b), "cache")
		if _, err := s.Materialize(context.Background(), nodecache.OpenSnapshots(cache)); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(cache)
		b.StartTimer()
	}
	b.ReportMetric(stop(), "peak-heap-MiB")
}

func BenchmarkRawZstdDecode(b *testing.B) {
	store := benchStore(b)
	s, err := Open(context.Background(), store, "v1", ReadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	_, size := benchFile(b)
	workers := runtime.GOMAXPROCS(0)
	dec, _ := zstd.NewReader(nil, zstd.WithDecoderConcurrency(workers))
	defer dec.Close()
	b.SetBytes(size)
	for b.Loop() {
		var g errgroup.Group
		jobs := make(chan chunkRef)
		for range workers {
			g.Go(func() error {
				dst := make([]byte, 0, DefaultChunkSize)
				for c := range jobs {
					if _, err := dec.DecodeAll(store.get(c.desc.Digest), dst[:0]); err != nil {
						return err
					}
				}
				return nil
			})
		}
		for _, c := range s.chunks {
			jobs <- c
		}
		close(jobs)
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIncremental snapshots the bench file into an empty store,
// keeping a page index, rewrites 5% of its data pages with random bytes
// the way a guest filling a tmpfs file does (runs of pages in about a
// quarter of the data chunks: what `cryoctl bench` measured), and
// snapshots it again with the index (timed): changed chunks are uploaded
// as deltas holding the changed pages. uploaded/first is that second
// snapshot's upload as a share of the first's; uploaded/first-full and
// s/op-full what it would upload and take without the index (whole
// changed chunks).
func BenchmarkIncremental(b *testing.B) {
	path, _ := benchFile(b)
	idx := filepath.Join(bench.dir, "pageindex")
	var first, second, full WriteStats
	var changed changeStats
	var fullTime time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		store := newMemStore()
		first = writeBenchOpts(b, store, "v1", path, WriteOptions{IndexPath: idx})
		s, err := Open(context.Background(), store, "v1", ReadOptions{})
		if err != nil {
			b.Fatal(err)
		}
		changed = changePages(b, path, s, 0.27, 0.05, i)
		// Without the index, into a store that only counts (the v1 store
		// stays as it is).
		t0 := time.Now()
		full = writeBench(b, discardStore{store}, "full", path)
		fullTime += time.Since(t0)
		base, err := LoadPageIndex(idx)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		second = writeBenchOpts(b, store, "v2", path, WriteOptions{Base: base})
	}
	bench.store = nil // the file changed
	ratio := float64(second.UploadedBytes) / float64(first.UploadedBytes)
	b.ReportMetric(ratio, "uploaded/first")
	b.ReportMetric(float64(full.UploadedBytes)/float64(first.UploadedBytes), "uploaded/first-full")
	b.ReportMetric(fullTime.Seconds()/float64(b.N), "s/op-full")
	b.ReportMetric(float64(changed.pages)/float64(changed.dataPages), "pages-changed/data")
	b.ReportMetric(float64(changed.chunks), "chunks-changed")
	b.ReportMetric(float64(second.Deltas), "deltas")
	b.ReportMetric(float64(first.Chunks), "chunks")
	if second.Deltas != changed.chunks || second.UploadedChunks != changed.chunks {
		b.Fatalf("second snapshot: %d deltas, %d chunks uploaded; %d chunks changed", second.Deltas, second.UploadedChunks, changed.chunks)
	}
	// The changed pages are random: no delta of them can be smaller. The
	// deltas, config and manifest may add a little.
	floor := float64(changed.pages) * PageSize
	b.ReportMetric(floor/float64(first.UploadedBytes), "changed/first")
	if over := float64(second.UploadedBytes) / floor; over > 1.05 && first.Chunks >= 100 {
		b.Fatalf("second snapshot uploaded %d bytes for %.0f bytes of changed pages (%.2fx)", second.UploadedBytes, floor, over)
	}
}

type changeStats struct{ chunks, pages, dataPages int }

// changePages rewrites, in a share chunkShare of the stored chunks of the
// snapshot s of path, random pages with random bytes, pageShare of the
// data pages in all.
func changePages(b *testing.B, path string, s *Snapshot, chunkShare, pageShare float64, gen int) changeStats {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(uint64(gen), 5))
	var st changeStats
	page := make([]byte, PageSize)
	for _, c := range s.chunks {
		pages := int(c.size / PageSize)
		st.dataPages += pages
		if r.Float64() >= chunkShare {
			continue
		}
		st.chunks++
		n := int(float64(pages) * pageShare / chunkShare)
		for _, p := range r.Perm(pages)[:n] {
			fillRandom(r, page)
			if _, err := f.WriteAt(page, c.off+int64(p)*PageSize); err != nil {
				b.Fatal(err)
			}
		}
		st.pages += n
	}
	return st
}

// BenchmarkWriteIndexed is BenchmarkWrite keeping a page index: what
// hashing every page costs a first snapshot.
func BenchmarkWriteIndexed(b *testing.B) {
	path, size := benchFile(b)
	b.SetBytes(size)
	opts := WriteOptions{IndexPath: filepath.Join(bench.dir, "pageindex-w")}
	for b.Loop() {
		writeBenchOpts(b, discardStore{newMemStore()}, "v1", path, opts)
	}
}
