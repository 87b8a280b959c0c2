package snapshot

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/cryo-runtime/cryo/nodecache"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

const pagesPerTestChunk = testCS / PageSize

// overwritePages writes random bytes over the given pages (page numbers
// in the file) of path; a page past the end is cut at the end.
func overwritePages(t testing.TB, path string, seed uint64, pages ...int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	r := rand.New(rand.NewPCG(seed, 11))
	buf := make([]byte, PageSize)
	for _, p := range pages {
		off := p * PageSize
		fillRandom(r, buf)
		if _, err := f.WriteAt(buf[:min(PageSize, st.Size()-off)], off); err != nil {
			t.Fatal(err)
		}
	}
}

// manifestOf returns the manifest that ref names.
func manifestOf(t testing.TB, store *memStore, ref string) ocispec.Manifest {
	t.Helper()
	desc, err := store.Resolve(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(store.get(desc.Digest), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// layerAt returns the layer of file at off, and whether it is a delta.
func layerAt(t testing.TB, m ocispec.Manifest, file string, off int64) (ocispec.Descriptor, bool) {
	t.Helper()
	for _, l := range m.Layers {
		if l.Annotations[AnnotationFile] == file && l.Annotations[AnnotationOffset] == itoa(off) {
			return l, l.Annotations[AnnotationBase] != ""
		}
	}
	t.Fatalf("no layer of %s at %d", file, off)
	return ocispec.Descriptor{}, false
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// materializeCheck materializes ref and compares it with ts's files.
func materializeCheck(t *testing.T, ts *testSnap, store *memStore, ref string, opts ReadOptions) *Snapshot {
	t.Helper()
	s := open(t, store, ref, opts)
	m, err := s.Materialize(context.Background(), nodecache.OpenSnapshots(t.TempDir()))
	if err != nil {
		t.Fatalf("materialize %s: %v", ref, err)
	}
	ts.checkFiles(t, m)
	if _, err := s.Verify(context.Background()); err != nil {
		t.Fatalf("verify %s: %v", ref, err)
	}
	return s
}

// deltaSetup writes "v1" of a test snapshot with a page index, changes a
// few pages, and writes "v2" against the index. It returns the index path.
func deltaSetup(t *testing.T, ts *testSnap, store *memStore, opts WriteOptions) (first, second WriteStats, idx string) {
	t.Helper()
	idx = filepath.Join(t.TempDir(), "pageindex")
	opts.IndexPath = idx
	first, _ = ts.write(t, store, "v1", opts)
	// RAM: 2 pages of chunk 0 (random), 1 of chunk 1 (text), the last
	// (short) page of the file; 12 of 16 pages of chunk 5 (a full chunk
	// again); data where chunk 3 held written zeros. devstate: one page of
	// its short last chunk.
	p := int64(pagesPerTestChunk)
	overwritePages(t, ts.paths.RAM, 1, 3, 7, p+2, 40*p-1, 5*p, 5*p+1, 5*p+2, 5*p+3, 5*p+4, 5*p+5, 5*p+6, 5*p+7, 5*p+8, 5*p+9, 5*p+10, 5*p+11, 3*p+4)
	overwritePages(t, ts.paths.DevState, 2, 4*p+1)
	base, err := LoadPageIndex(idx)
	if err != nil {
		t.Fatal(err)
	}
	opts.Base = base
	second, _ = ts.write(t, store, "v2", opts)
	return first, second, idx
}

func TestDeltaRoundTrip(t *testing.T) {
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
			first, second, idx := deltaSetup(t, ts, store, opts)
			if first.Deltas != 0 || first.Bases != 0 {
				t.Errorf("first write: %d deltas, %d bases", first.Deltas, first.Bases)
			}
			// RAM chunks 0, 1 and the last; devstate's last.
			if second.Deltas != 4 || second.Bases != 4 {
				t.Errorf("second write: %d deltas, %d bases; want 4, 4", second.Deltas, second.Bases)
			}
			// 4 deltas of 1-2 pages, chunks 3 and 5 full, config, manifest.
			if second.UploadedChunks != 6 || second.UploadedBytes > 9*testCS/2 {
				t.Errorf("second write uploaded %d chunks, %d bytes (first %d)", second.UploadedChunks, second.UploadedBytes, first.UploadedBytes)
			}
			t.Logf("first uploaded %d bytes, second %d (%.1f%%)", first.UploadedBytes, second.UploadedBytes, 100*float64(second.UploadedBytes)/float64(first.UploadedBytes))
			m := manifestOf(t, store, "v2")
			for off, want := range map[int64]bool{0: true, testCS: true, 39 * testCS: true, 3 * testCS: false, 5 * testCS: false, 10 * testCS: false} {
				if _, delta := layerAt(t, m, FileRAM, off); delta != want {
					t.Errorf("RAM chunk at %d: delta %v, want %v", off, delta, want)
				}
			}
			s := materializeCheck(t, ts, store, "v2", ropts)
			if s.Metadata.FormatVersion < FormatVersionDelta || s.Metadata.Totals.Deltas != 4 || s.Chunks() != first.Chunks+1 {
				t.Errorf("v2: version %d, totals %+v, %d chunks", s.Metadata.FormatVersion, s.Metadata.Totals, s.Chunks())
			}
			open(t, store, "v1", ropts) // still there, still version 1

			// The index is private and holds no data.
			st, err := os.Stat(idx)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("index %v, %v", st, err)
			}
			ib, _ := os.ReadFile(idx)
			raw, _ := os.ReadFile(ts.paths.RAM)
			if bytes.Contains(ib, raw[testCS+100:testCS+140]) {
				t.Error("page index holds chunk data")
			}

			// Third: more pages of chunk 0 change. Its delta is still
			// against the v1 chunk (depth 1), and holds all 4 pages.
			overwritePages(t, ts.paths.RAM, 3, 9, 10)
			base, err := LoadPageIndex(idx)
			if err != nil {
				t.Fatal(err)
			}
			opts.Base, opts.IndexPath = base, idx
			third, _ := ts.write(t, store, "v3", opts)
			m1, m3 := manifestOf(t, store, "v1"), manifestOf(t, store, "v3")
			l1, _ := layerAt(t, m1, FileRAM, 0)
			l3, delta := layerAt(t, m3, FileRAM, 0)
			if !delta || l3.Annotations[AnnotationBase] != l1.Digest.String() {
				t.Errorf("v3 chunk 0: delta %v against %s, want against v1's %s", delta, l3.Annotations[AnnotationBase], l1.Digest)
			}
			if l5, delta := layerAt(t, m3, FileRAM, 5*testCS); delta {
				t.Errorf("v3 chunk 5 is a delta against %s: v2 stored it full and unchanged since", l5.Annotations[AnnotationBase])
			}
			if third.UploadedChunks != 1 {
				t.Errorf("third write uploaded %d chunks, want 1 (chunk 0's delta)", third.UploadedChunks)
			}
			materializeCheck(t, ts, store, "v3", ropts)
		})
	}
}

// TestDeltaSharedBase: two places whose v1 chunks were equal share one
// base in a plaintext snapshot; it is fetched once.
func TestDeltaSharedBase(t *testing.T) {
	ts := newTestSnap(t)
	raw, _ := os.ReadFile(ts.paths.RAM)
	copy(raw[10*testCS:11*testCS], raw[:testCS])
	if err := os.WriteFile(ts.paths.RAM, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	store := newMemStore()
	idx := filepath.Join(t.TempDir(), "pageindex")
	ts.write(t, store, "v1", WriteOptions{IndexPath: idx})
	p := int64(pagesPerTestChunk)
	overwritePages(t, ts.paths.RAM, 5, 1, 10*p+2)
	base, err := LoadPageIndex(idx)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := ts.write(t, store, "v2", WriteOptions{Base: base})
	if st.Deltas != 2 || st.Bases != 1 {
		t.Fatalf("%d deltas, %d bases; want 2, 1", st.Deltas, st.Bases)
	}
	l, _ := layerAt(t, manifestOf(t, store, "v2"), FileRAM, 0)
	var mu sync.Mutex
	fetched := 0
	store.fetchHook = func(desc ocispec.Descriptor, off, n int64, b []byte) []byte {
		if desc.Digest.String() == l.Annotations[AnnotationBase] {
			mu.Lock()
			fetched++
			mu.Unlock()
		}
		return b
	}
	materializeCheck(t, ts, store, "v2", ReadOptions{})
	if fetched != 2 { // once by Materialize, once by Verify
		t.Errorf("shared base fetched %d times by a materialize and a verify, want 2", fetched)
	}
}

// TestDeltaIndexMismatch: an index that does not fit is ignored and full
// chunks are written; a base gone from the store costs only its chunk.
func TestDeltaIndexMismatch(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	cases := []struct {
		name   string
		opts   WriteOptions // of the second write
		edit   func(t *testing.T, store *memStore, idx string)
		deltas int
	}{
		{"fits", WriteOptions{StoreID: "file:///s"}, nil, 4},
		{"other chunk size", WriteOptions{StoreID: "file:///s", ChunkSize: 2 * testCS}, nil, 0},
		{"other key", WriteOptions{StoreID: "file:///s", EncryptionKey: key}, nil, 0},
		{"other store", WriteOptions{StoreID: "file:///t"}, nil, 0},
		{"base gone from the store", WriteOptions{StoreID: "file:///s"}, func(t *testing.T, store *memStore, idx string) {
			l, _ := layerAt(t, manifestOf(t, store, "v1"), FileRAM, 0)
			store.mu.Lock()
			delete(store.blobs, l.Digest)
			store.mu.Unlock()
		}, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestSnap(t)
			store := newMemStore()
			idx := filepath.Join(t.TempDir(), "pageindex")
			ts.write(t, store, "v1", WriteOptions{IndexPath: idx, StoreID: "file:///s"})
			if tc.edit != nil {
				tc.edit(t, store, idx)
			}
			p := int64(pagesPerTestChunk)
			overwritePages(t, ts.paths.RAM, 1, 3, p+2, 40*p-1)
			overwritePages(t, ts.paths.DevState, 2, 4*p+1)
			base, err := LoadPageIndex(idx)
			if err != nil {
				t.Fatal(err)
			}
			opts := tc.opts
			opts.Base = base
			st, _ := ts.write(t, store, "v2", opts)
			if st.Deltas != tc.deltas {
				t.Errorf("%d deltas, want %d", st.Deltas, tc.deltas)
			}
			materializeCheck(t, ts, store, "v2", ReadOptions{DecryptionKey: opts.EncryptionKey})
		})
	}
}

func TestPageIndexDamaged(t *testing.T) {
	ts := newTestSnap(t)
	idx := filepath.Join(t.TempDir(), "pageindex")
	ts.write(t, newMemStore(), "v1", WriteOptions{IndexPath: idx})
	b, _ := os.ReadFile(idx)
	for name, edit := range map[string]func([]byte) []byte{
		"truncated": func(b []byte) []byte { return b[:len(b)/2] },
		"flipped":   func(b []byte) []byte { b[len(b)/2] ^= 1; return b },
		"empty":     func([]byte) []byte { return nil },
	} {
		if err := os.WriteFile(idx, edit(append([]byte(nil), b...)), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadPageIndex(idx); err == nil {
			t.Errorf("%s index loaded", name)
		}
	}
	// A well-formed index with a lying entry is refused too.
	x, err := parsePageIndex(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range x.entries {
		e.pages = e.pages[:len(e.pages)-1]
		break
	}
	if err := x.save(idx); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPageIndex(idx); !errdefs.IsInvalidArgument(err) {
		t.Errorf("index with short page hashes: %v", err)
	}
}

func TestDeltaPayload(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int64{testCS, testCS - 1000, 11 * PageSize, 100} {
		base := make([]byte, size)
		fillRandom(r, base)
		raw := append([]byte(nil), base...)
		pages, _ := deltaGeometry(size)
		changed := []int{0, pages - 1}
		if pages == 1 {
			changed = changed[:1]
		}
		for _, i := range changed {
			s, e := pageSpan(i, size)
			fillRandom(r, raw[s:e])
			raw[s] ^= 1
		}
		p := appendDeltaPayload(nil, raw, changed)
		if int64(len(p)) != deltaPayloadSize(size, changed) {
			t.Errorf("size %d: payload %d bytes, deltaPayloadSize %d", size, len(p), deltaPayloadSize(size, changed))
		}
		out := append([]byte(nil), base...)
		if err := applyDelta(p, out); err != nil || !bytes.Equal(out, raw) {
			t.Errorf("size %d: apply: %v", size, err)
		}
		if err := applyDelta(p, append([]byte(nil), raw...)); err != nil {
			t.Errorf("size %d: apply to the result: %v", size, err)
		}
		bad := append([]byte(nil), base...)
		bad[len(bad)/2+1] ^= 1 // a byte no delta page covers, in general
		if len(changed) == 2 && pages > 3 {
			if err := applyDelta(p, bad); !errdefs.IsDataLoss(err) {
				t.Errorf("size %d: delta applied to the wrong base: %v", size, err)
			}
		}
	}
}
