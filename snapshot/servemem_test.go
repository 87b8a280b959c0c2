package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
)

// hostileDisks re-publishes ref with n more disks of 4 TiB each and no
// chunk (all holes): a manifest of a few KiB whose files claim 100 TiB.
func hostileDisks(t testing.TB, store *memStore, ref string, n int) []string {
	var names []string
	rewrite(t, store, ref, func(_ *ocispec.Manifest, md *Metadata) {
		for i := range n {
			name := DiskFile(fmt.Sprintf("h%d", i))
			md.Files = append(md.Files, FileInfo{Name: name, Size: 4 << 40})
			names = append(names, name)
		}
	})
	return names
}

// TestServeLogicalSizeCostsNothing: serving 25 disks that claim 4 TiB each
// (a record of a few KiB) allocates a few KiB, not a slot per logical
// chunk (12.5 GiB at 64 KiB chunks); with the node's max_disk_size the
// snapshot is refused at Open, naming the file and the field.
func TestServeLogicalSizeCostsNothing(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	disks := hostileDisks(t, store, "v1", 25)
	ctx := context.Background()

	t.Run("served", func(t *testing.T) {
		s, err := Open(ctx, store, "v1", ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var readers []*FileReader
		page := make([]byte, PageSize)
		for _, name := range disks {
			r, err := s.ServeFile(name)
			if err != nil {
				t.Fatal(err)
			}
			readers = append(readers, r)
			// Holes read as zeros, at the start and the end of 4 TiB.
			for _, off := range []int64{0, r.Size() - PageSize} {
				page[0] = 1
				if n, err := r.ReadAt(page, off); n != PageSize || err != nil || page[0] != 0 {
					t.Fatalf("%s at %d: %d, %v, first byte %d", name, off, n, err, page[0])
				}
			}
			if c := r.Chunks(); len(c) != 0 {
				t.Fatalf("%s: %d chunks", name, len(c))
			}
		}
		runtime.ReadMemStats(&after)
		for _, r := range readers {
			r.Close()
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
			t.Fatalf("serving 25 disks of 4 TiB with no chunk allocated %d MiB", got>>20)
		} else {
			t.Logf("serving 25 disks of 4 TiB allocated %d KiB", got>>10)
		}
	})
	t.Run("refused by max_disk_size", func(t *testing.T) {
		_, err := Open(ctx, store, "v1", ReadOptions{MaxDiskSize: 64 << 30})
		if !names("restore.max_disk_size")(err) || !names(disks[0])(err) {
			t.Fatalf("Open: %v, want an invalid argument naming %s and restore.max_disk_size", err, disks[0])
		}
	})
	t.Run("within max_disk_size", func(t *testing.T) {
		if _, err := Open(ctx, store, "v1", ReadOptions{MaxDiskSize: 4 << 40}); err != nil {
			t.Fatal(err)
		}
	})
}

// gateStore is a memStore whose fetches of chunk blobs wait for a gate
// and count how many wait at once.
type gateStore struct {
	*memStore
	gate            chan struct{}
	inFlight, peak  atomic.Int32
	chunkMediaTypes map[string]bool
}

func (g *gateStore) hook(desc ocispec.Descriptor, _, _ int64, b []byte) []byte {
	if !g.chunkMediaTypes[desc.MediaType] {
		return b
	}
	n := g.inFlight.Add(1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			break
		}
	}
	<-g.gate
	g.inFlight.Add(-1)
	return b
}

// TestServeDecodeBudget: concurrent page faults on distinct chunks decode
// at most as many chunks at once as ReadOptions.MaxMemory holds; the
// others wait (under their context) and then succeed.
func TestServeDecodeBudget(t *testing.T) {
	ts := newTestSnap(t)
	mem := newMemStore()
	ts.write(t, mem, "v1", WriteOptions{})
	g := &gateStore{memStore: mem, gate: make(chan struct{}), chunkMediaTypes: map[string]bool{MediaTypeChunk: true, MediaTypeChunkEncrypted: true}}
	ctx := context.Background()
	w := decodeWeight(testCS, false, false, 1<<30)
	s, err := Open(ctx, g, "v1", ReadOptions{MaxMemory: 2*w + w/2}) // room for two decodes
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, s, FileRAM)
	var idxs []int64
	for _, c := range r.Chunks() {
		idxs = append(idxs, c.Offset/testCS)
	}
	if len(idxs) < 8 {
		t.Fatalf("setup: %d chunks", len(idxs))
	}
	mem.mu.Lock()
	mem.fetchHook = g.hook
	mem.mu.Unlock()

	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i, idx := range idxs[:8] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.ReadAt(make([]byte, PageSize), idx*testCS)
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.inFlight.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // let any third decode start
	if p := g.peak.Load(); p != 2 {
		t.Fatalf("%d decodes at once, the budget holds 2", p)
	}
	// A fault that cannot get decode memory gives up with its context.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = r.ReadAtContext(short, make([]byte, PageSize), idxs[len(idxs)-1]*testCS)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a fault beyond the budget: %v, want the deadline", err)
	}
	close(g.gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fault %d: %v", i, err)
		}
	}
	if p := g.peak.Load(); p > 2 {
		t.Fatalf("%d decodes at once, the budget holds 2", p)
	}
	// The decoded chunks kept are bounded too.
	c := s.serving.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bytes > c.max || c.max > max(2*testCS, s.opts.MaxMemory/2) {
		t.Fatalf("decoded cache holds %d bytes, bound %d, budget %d", c.bytes, c.max, s.opts.MaxMemory)
	}
}

// TestCopyFile: CopyFile writes the device state, verified, to a file,
// and refuses one over its limit before writing anything.
func TestCopyFile(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	ctx := context.Background()
	s, err := Open(ctx, store, "v1", ReadOptions{MaxMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	want, err := s.ReadFile(ctx, FileDevState, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := createFile(t, filepath.Join(dir, "ok"))
	if err := s.CopyFile(ctx, FileDevState, int64(len(want)), f); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "ok"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("copied device state differs (%d bytes, want %d)", len(got), len(want))
	}
	f = createFile(t, filepath.Join(dir, "big"))
	if err := s.CopyFile(ctx, FileDevState, int64(len(want))-1, f); !names("devstate")(err) {
		t.Fatalf("CopyFile over its limit: %v", err)
	}
	if st, _ := f.Stat(); st.Size() != 0 {
		t.Fatalf("a refused copy wrote %d bytes", st.Size())
	}
}

func createFile(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// BenchmarkServeHostile measures what serving costs in memory where a
// snapshot's publisher chooses the sizes:
//   - record: 25 disks that claim 4 TiB each (no chunk) in a manifest of a
//     few KiB: Open, serve every file, read a page of each;
//   - faults: 16 concurrent page faults on distinct 64 MiB chunks.
//
// It reports the bytes allocated per operation and the peak heap in use.
func BenchmarkServeHostile(b *testing.B) {
	ctx := context.Background()
	b.Run("record", func(b *testing.B) {
		ts := newTestSnap(b)
		store := newMemStore()
		ts.write(b, store, "v1", WriteOptions{})
		disks := hostileDisks(b, store, "v1", 25)
		page := make([]byte, PageSize)
		measure(b, func() {
			s, err := Open(ctx, store, "v1", ReadOptions{})
			if err != nil {
				b.Fatal(err)
			}
			for _, name := range append([]string{FileRAM}, disks...) {
				r, err := s.ServeFile(name)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := r.ReadAt(page, r.Size()/2); err != nil {
					b.Fatal(err)
				}
				r.Close()
			}
		})
	})
	b.Run("faults", func(b *testing.B) {
		const cs, n = MaxChunkSize, 16
		dir := b.TempDir()
		ts := newTestSnap(b)
		ts.paths.RAM = filepath.Join(dir, "ram")
		// A random page per chunk, the rest zeros: small to store, a
		// whole chunk to decode.
		if err := writeChunked(ts.paths.RAM, n*cs, func(i int64, p []byte) bool {
			clear(p)
			if i%(cs/DefaultChunkSize) == 0 {
				fillRandom(rand.New(rand.NewPCG(uint64(i), 1)), p[:PageSize])
			}
			return true
		}); err != nil {
			b.Fatal(err)
		}
		ts.md.Fingerprint.MemoryMiB = n * cs >> 20
		store := newMemStore()
		ts.write(b, store, "v1", WriteOptions{ChunkSize: cs})
		measure(b, func() {
			s, err := Open(ctx, store, "v1", ReadOptions{})
			if err != nil {
				b.Fatal(err)
			}
			r, err := s.ServeFile(FileRAM)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			var g errgroup.Group
			for i := range int64(n) {
				g.Go(func() error {
					_, err := r.ReadAt(make([]byte, PageSize), i*cs)
					return err
				})
			}
			if err := g.Wait(); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// measure runs op b.N times and reports the MiB it allocated per run and
// the peak heap in use above the start (each run starts after a GC, so
// that the last one's garbage is not counted).
func measure(b *testing.B, op func()) {
	stop := peakHeap()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		runtime.GC()
		b.StartTimer()
		op()
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/(1<<20), "alloc-MiB/op")
	b.ReportMetric(stop(), "peak-heap-MiB")
}

// TestServeRecycledBuffersConcurrent: with a cache of two chunks, so that
// every decode reuses an evicted chunk's buffer, concurrent random reads
// of three files still read exactly their content.
func TestServeRecycledBuffersConcurrent(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	s, err := Open(context.Background(), store, "v1", ReadOptions{MaxMemory: 3 * testCS})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.serving.cache; c.max != 2*testCS {
		t.Fatalf("setup: cache of %d bytes", c.max)
	}
	files := map[string]string{FileRAM: ts.paths.RAM, DiskFile("root"): ts.paths.Disks["root"], DiskFile("data"): ts.paths.Disks["data"]}
	var g errgroup.Group
	for name, path := range files {
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		r := serve(t, s, name)
		for w := range 4 {
			g.Go(func() error {
				rnd := rand.New(rand.NewPCG(uint64(w), uint64(len(name))))
				for range 300 {
					off := rnd.Int64N(int64(len(want)))
					p := make([]byte, 1+rnd.IntN(2*testCS))
					n, err := r.ReadAt(p, off)
					if err != nil && n != len(p) && int64(n) != int64(len(want))-off {
						return fmt.Errorf("%s: read %d at %d: %d, %v", name, len(p), off, n, err)
					}
					if !bytes.Equal(p[:n], want[off:off+int64(n)]) {
						return fmt.Errorf("%s: read %d at %d: content differs", name, len(p), off)
					}
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestDecodedCacheDropsWhenIdle: the chunks served reads decoded are kept
// while reads come, and dropped, spare buffers too, once none came for the
// cache's idle time: an idle sandbox's shim keeps no decoded chunk. Reads
// after the drop decode again and are right.
func TestDecodedCacheDropsWhenIdle(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	s := open(t, store, "v1", ReadOptions{})
	c := s.serving.cache
	c.mu.Lock()
	c.idle = 300 * time.Millisecond
	c.mu.Unlock()
	want, err := os.ReadFile(ts.paths.RAM)
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, s, FileRAM)
	read := func() {
		p := make([]byte, 3*testCS)
		if _, err := r.ReadAt(p, 0); err != nil || !bytes.Equal(p, want[:len(p)]) {
			t.Fatalf("read: %v, or content differs", err)
		}
	}
	read()
	if c.held() == 0 {
		t.Fatal("nothing cached after a read")
	}
	// Reads every 100 ms keep it.
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		read()
	}
	if c.held() == 0 {
		t.Fatal("cache dropped while reads came every 100 ms (idle time 300 ms)")
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.held() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := c.held(); n != 0 {
		t.Fatalf("cache holds %d bytes after 5 s without a read", n)
	}
	fetches := store.fetches.Load()
	read()
	if store.fetches.Load() == fetches && c.held() == 0 {
		t.Error("a read after the drop neither fetched nor cached")
	}
}

// held is what the cache holds, chunks and spare buffers, in bytes.
func (c *decodedCache) held() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes + c.freeBytes
}
