package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
)

// readAllRandom reads r in pieces of random sizes at random offsets and
// compares every piece with want; it also reads the whole file once.
func readAllRandom(t *testing.T, r *FileReader, want []byte) {
	t.Helper()
	if r.Size() != int64(len(want)) {
		t.Fatalf("%s: size %d, want %d", r.Name(), r.Size(), len(want))
	}
	got := make([]byte, len(want))
	if n, err := r.ReadAt(got, 0); n != len(want) || (err != nil && err != io.EOF) {
		t.Fatalf("%s: read all: %d, %v", r.Name(), n, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: content differs", r.Name())
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		off := rnd.Int64N(int64(len(want)))
		n := 1 + rnd.IntN(3*testCS)
		p := make([]byte, n)
		c, err := r.ReadAt(p, off)
		end := min(off+int64(n), int64(len(want)))
		if int64(c) != end-off || (c < n && err != io.EOF) || (c == n && err != nil) {
			t.Fatalf("%s: read %d at %d: %d, %v", r.Name(), n, off, c, err)
		}
		if !bytes.Equal(p[:c], want[off:end]) {
			t.Fatalf("%s: read %d at %d: content differs", r.Name(), n, off)
		}
	}
	if _, err := r.ReadAt(make([]byte, 1), int64(len(want))); err != io.EOF {
		t.Fatalf("%s: read at the end: %v, want EOF", r.Name(), err)
	}
}

func serve(t *testing.T, s *Snapshot, name string) *FileReader {
	t.Helper()
	r, err := s.ServeFile(name)
	if err != nil {
		t.Fatalf("serve %s: %v", name, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestServeFile(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "k"), filepath.Join(dir, "k.pub")
	if err := GenerateSigningKey(priv, pub); err != nil {
		t.Fatal(err)
	}
	sk, err := LoadSigningKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := LoadPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		w    WriteOptions
		r    ReadOptions
	}{
		{"plain", WriteOptions{}, ReadOptions{}},
		{"encrypted and signed", WriteOptions{EncryptionKey: bytes.Repeat([]byte{5}, 32), SigningKey: sk},
			ReadOptions{DecryptionKey: bytes.Repeat([]byte{5}, 32), RequireEncryption: true, PublicKey: pk, RequireSignature: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestSnap(t)
			store := newMemStore()
			ts.write(t, store, "v1", tc.w)
			s := open(t, store, "v1", tc.r)
			if tc.r.RequireSignature && !s.Signed {
				t.Fatal("not signed")
			}
			for name, path := range map[string]string{FileRAM: ts.paths.RAM, DiskFile("root"): ts.paths.Disks["root"], DiskFile("data"): ts.paths.Disks["data"], FileDevState: ts.paths.DevState} {
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				readAllRandom(t, serve(t, s, name), want)
			}
			// A hole (chunk 2 of ram) costs no fetch.
			r := serve(t, s, FileRAM)
			before := store.fetches.Load()
			p := make([]byte, testCS)
			if _, err := r.ReadAt(p, 2*testCS); err != nil || !bytes.Equal(p, make([]byte, testCS)) {
				t.Fatalf("hole: %v", err)
			}
			if n := store.fetches.Load() - before; n != 0 {
				t.Errorf("reading a hole fetched %d times", n)
			}
			if _, err := s.ServeFile("disk:nope"); !errdefs.IsNotFound(err) {
				t.Errorf("serve a missing file: %v", err)
			}
		})
	}
}

func TestServeFileEncryptedNeedsKey(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{EncryptionKey: bytes.Repeat([]byte{5}, 32)})
	s := open(t, store, "v1", ReadOptions{})
	if _, err := s.ServeFile(FileRAM); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("serve without the key: %v", err)
	}
}

func TestServeFileDelta(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "encrypted"}[enc], func(t *testing.T) {
			ts := newTestSnap(t)
			store := newMemStore()
			var opts WriteOptions
			var ropts ReadOptions
			if enc {
				opts.EncryptionKey = bytes.Repeat([]byte{7}, 32)
				ropts.DecryptionKey = opts.EncryptionKey
			}
			deltaSetup(t, ts, store, opts)
			s := open(t, store, "v2", ropts)
			r := serve(t, s, FileRAM)
			deltas := 0
			for _, c := range r.Chunks() {
				if c.Base != nil {
					deltas++
				}
			}
			if deltas != 3 {
				t.Errorf("%d delta chunks in ram, want 3", deltas)
			}
			want, _ := os.ReadFile(ts.paths.RAM)
			readAllRandom(t, r, want)
			want, _ = os.ReadFile(ts.paths.DevState)
			readAllRandom(t, serve(t, s, FileDevState), want)
		})
	}
}

// TestServeFileDamaged: a chunk the store corrupts, truncates or pads, or
// the base of a delta it corrupts, is an error (data loss) naming the
// chunk, never bytes; the other chunks still read.
func TestServeFileDamaged(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delta bool
		hook  func(b []byte) []byte
	}{
		{"corrupted", false, func(b []byte) []byte { b[len(b)/2] ^= 1; return b }},
		{"truncated", false, func(b []byte) []byte { return b[:len(b)-1] }},
		{"extra bytes", false, func(b []byte) []byte { return append(b, 0) }},
		{"corrupted base of a delta", true, func(b []byte) []byte { b[3] ^= 0x80; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestSnap(t)
			store := newMemStore()
			ref := "v1"
			if tc.delta {
				deltaSetup(t, ts, store, WriteOptions{})
				ref = "v2"
			} else {
				ts.write(t, store, ref, WriteOptions{})
			}
			s := open(t, store, ref, ReadOptions{})
			r := serve(t, s, FileRAM)
			victim := r.Chunks()[0] // chunk 0: random data (a delta in v2)
			if victim.Offset != 0 || (victim.Base != nil) != tc.delta {
				t.Fatalf("chunk 0: %+v", victim)
			}
			bad := victim.Stored
			if tc.delta {
				bad = *victim.Base
			}
			store.fetchHook = func(desc ocispec.Descriptor, off, length int64, b []byte) []byte {
				if desc.Digest == bad.Digest {
					return tc.hook(b)
				}
				return b
			}
			p := bytes.Repeat([]byte{0xAA}, 2*testCS)
			n, err := r.ReadAt(p, 0)
			if !errdefs.IsDataLoss(err) {
				t.Fatalf("read of a damaged chunk: %d, %v; want data loss", n, err)
			}
			if n != 0 {
				t.Errorf("read of a damaged chunk returned %d bytes", n)
			}
			if !bytes.Contains([]byte(err.Error()), []byte(victim.Stored.Digest)) {
				t.Errorf("error %q does not name the chunk %s", err, victim.Stored.Digest)
			}
			if !errors.Is(r.Err(), err) && r.Err().Error() != err.Error() {
				t.Errorf("Err() = %v, want %v", r.Err(), err)
			}
			want, _ := os.ReadFile(ts.paths.RAM)
			q := make([]byte, testCS)
			if _, err := r.ReadAt(q, 5*testCS); err != nil || !bytes.Equal(q, want[5*testCS:6*testCS]) {
				t.Errorf("an intact chunk after the damaged one: %v", err)
			}
		})
	}
}

// TestServeFileNodeCache: readers of one snapshot through one node cache,
// many at once, download each chunk once; a prefetch then downloads only
// what they did not read, and the next reader downloads nothing.
func TestServeFileNodeCache(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	cache, err := nodecache.OpenBlobs(filepath.Join(t.TempDir(), "blobs"), 0)
	if err != nil {
		t.Fatal(err)
	}
	cs := nodecache.NewCachingStore(store, cache, nodecache.CachingOptions{})
	want, _ := os.ReadFile(ts.paths.RAM)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := Open(context.Background(), cs, "v1", ReadOptions{})
			if err != nil {
				errs <- err
				return
			}
			r, err := s.ServeFile(FileRAM)
			if err != nil {
				errs <- err
				return
			}
			defer r.Close()
			p := make([]byte, 10*testCS)
			if _, err := r.ReadAt(p, 0); err != nil || !bytes.Equal(p, want[:10*testCS]) {
				errs <- errors.Join(err, errors.New("content differs"))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Chunks 0-9 of ram: 2, 3, 7, 8 are holes or zeros, 6 are stored.
	st := cache.Stats()
	chunkDownloads := st.Downloads - 2 // manifest and config
	if chunkDownloads != 6 {
		t.Errorf("8 readers of 10 chunks: %d chunk downloads, want 6 (stats %+v)", chunkDownloads, st)
	}
	s, err := Open(context.Background(), cs, "v1", ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, s, FileRAM)
	pst, err := r.Prefetch(context.Background(), 3, []int64{30, 30, -1, 1 << 40, 11})
	if err != nil {
		t.Fatal(err)
	}
	if stored := len(r.Chunks()); pst.Chunks != stored {
		t.Errorf("prefetch of %d chunks: %+v", stored, pst)
	}
	if got := cache.Stats().Downloads - st.Downloads; got != int64(len(r.Chunks())-6) {
		t.Errorf("prefetch downloaded %d chunks, want %d", got, len(r.Chunks())-6)
	}
	before := store.fetches.Load()
	readAllRandom(t, r, want)
	if n := store.fetches.Load() - before; n != 0 {
		t.Errorf("reads after the prefetch fetched %d times from the store", n)
	}
}

// BenchmarkServeFile reads a served RAM file of 4 MiB chunks in the 1 MiB
// pieces FUSE asks for: "decode" a chunk per 4 reads (fetch from the
// store, verify, decompress), "hit" from the decoded chunks kept.
func BenchmarkServeFile(b *testing.B) {
	const cs = 4 << 20
	dir := b.TempDir()
	ts := &testSnap{dir: dir, paths: SourcePaths{RAM: filepath.Join(dir, "ram"), DevState: filepath.Join(dir, "devstate"), Spec: []byte(`{}`)}}
	writeTestFile(b, ts.paths.RAM, 64<<20, cs, 1)
	writeTestFile(b, ts.paths.DevState, 4096, cs, 2)
	ts.md = newTestSnap(b).md
	store := newMemStore()
	ts.write(b, store, "v1", WriteOptions{ChunkSize: cs})
	s, err := Open(context.Background(), store, "v1", ReadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	p := make([]byte, 1<<20)
	for _, tc := range []struct {
		name string
		fn   func(r *FileReader, i int)
	}{
		{"decode", func(r *FileReader, i int) { r.ReadAt(p, int64(i%64)<<20) }},
		{"hit", func(r *FileReader, i int) { r.ReadAt(p, int64(i%4)<<20) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r, err := s.ServeFile(FileRAM)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			b.SetBytes(1 << 20)
			for i := 0; b.Loop(); i++ {
				tc.fn(r, i)
			}
		})
	}
}

// TestWorkingSet: a reader records the chunks its faults decoded, in the
// order of the first fault of each (never a hole, never twice), and a
// snapshot written with that working set opens with it.
func TestWorkingSet(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	s := open(t, store, "v1", ReadOptions{})
	r := serve(t, s, FileRAM)
	p := make([]byte, 100)
	for _, c := range []int64{6, 0, 2, 6, 0} { // chunk 2 is a hole
		if _, err := r.ReadAt(p, c*testCS+10); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.Order(); !slices.Equal(got, []int64{6, 0}) {
		t.Fatalf("order %v, want [6 0]", got)
	}
	ts.md.WorkingSet = r.Order()
	ts.write(t, store, "v2", WriteOptions{})
	if s2 := open(t, store, "v2", ReadOptions{}); !slices.Equal(s2.Metadata.WorkingSet, []int64{6, 0}) {
		t.Fatalf("written working set %v", s2.Metadata.WorkingSet)
	}
}

// TestPrefetchDamaged: a blob the store lost (corrupted, truncated,
// missing) ends the prefetch at once with an error naming the chunk and
// its digest, through the node cache and without one.
func TestPrefetchDamaged(t *testing.T) {
	for _, tc := range []struct {
		name string
		hook func(b []byte) []byte
		gone bool
	}{
		{"corrupted", func(b []byte) []byte { b[len(b)/2] ^= 1; return b }, false},
		{"truncated", func(b []byte) []byte { return b[:len(b)/2] }, false},
		{"missing", nil, true},
	} {
		for _, cached := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/cache=%v", tc.name, cached), func(t *testing.T) {
				ts := newTestSnap(t)
				store := newMemStore()
				ts.write(t, store, "v1", WriteOptions{})
				var st stores.Store = store
				if cached {
					cache, err := nodecache.OpenBlobs(filepath.Join(t.TempDir(), "blobs"), 0)
					if err != nil {
						t.Fatal(err)
					}
					st = nodecache.NewCachingStore(store, cache, nodecache.CachingOptions{})
				}
				r := serve(t, openStore(t, st, "v1"), FileRAM)
				victim := r.Chunks()[len(r.Chunks())/2]
				if tc.gone {
					store.mu.Lock()
					delete(store.blobs, victim.Stored.Digest)
					store.mu.Unlock()
				} else {
					store.fetchHook = func(desc ocispec.Descriptor, off, length int64, b []byte) []byte {
						if desc.Digest == victim.Stored.Digest {
							return tc.hook(b)
						}
						return b
					}
				}
				start := time.Now()
				_, err := r.Prefetch(context.Background(), 2, nil)
				if err == nil || !IsPermanent(err) {
					t.Fatalf("prefetch with a %s chunk: %v; want a permanent error", tc.name, err)
				}
				if d := time.Since(start); d > 5*time.Second {
					t.Errorf("prefetch took %v to fail", d)
				}
				for _, s := range []string{string(victim.Stored.Digest), fmt.Sprintf("offset %d", victim.Offset)} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not name %s", err, s)
					}
				}
			})
		}
	}
}

// flakyStore fails the first fails fetches of blob bad as unavailable.
type flakyStore struct {
	*memStore
	bad   digest.Digest
	fails atomic.Int32
	tries atomic.Int32
}

func (f *flakyStore) Fetch(ctx context.Context, desc ocispec.Descriptor, off, length int64) (io.ReadCloser, error) {
	if desc.Digest == f.bad {
		f.tries.Add(1)
		if f.fails.Add(-1) >= 0 {
			return nil, fmt.Errorf("blob %s: %w", desc.Digest, errdefs.ErrUnavailable)
		}
	}
	return f.memStore.Fetch(ctx, desc, off, length)
}

// TestPrefetchRetriesTransient: a blob that fails transiently does not
// stop the prefetch: the other blobs are fetched, the failed one is
// retried with backoff until it is in the node cache.
func TestPrefetchRetriesTransient(t *testing.T) {
	defer func(a, b time.Duration) { PrefetchRetryMin, PrefetchRetryMax = a, b }(PrefetchRetryMin, PrefetchRetryMax)
	PrefetchRetryMin, PrefetchRetryMax = 10*time.Millisecond, 40*time.Millisecond
	ts := newTestSnap(t)
	mem := newMemStore()
	ts.write(t, mem, "v1", WriteOptions{})
	fs := &flakyStore{memStore: mem}
	cache, err := nodecache.OpenBlobs(filepath.Join(t.TempDir(), "blobs"), 0)
	if err != nil {
		t.Fatal(err)
	}
	cs := nodecache.NewCachingStore(fs, cache, nodecache.CachingOptions{})
	r := serve(t, openStore(t, cs, "v1"), FileRAM)
	chunks := r.Chunks()
	fs.bad = chunks[0].Stored.Digest
	fs.fails.Store(4)
	if _, err := r.Prefetch(context.Background(), 1, nil); err != nil {
		t.Fatalf("prefetch with a transiently failing chunk: %v", err)
	}
	if n := fs.tries.Load(); n != 5 {
		t.Errorf("the failing chunk was tried %d times, want 5", n)
	}
	before := mem.fetches.Load()
	want, _ := os.ReadFile(ts.paths.RAM)
	readAllRandom(t, r, want)
	if n := mem.fetches.Load() - before; n != 0 {
		t.Errorf("reads after the prefetch fetched %d times from the store", n)
	}
}

func openStore(t *testing.T, store stores.Store, ref string) *Snapshot {
	t.Helper()
	s, err := Open(context.Background(), store, ref, ReadOptions{})
	if err != nil {
		t.Fatalf("open %s: %v", ref, err)
	}
	return s
}
