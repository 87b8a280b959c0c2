package snapshot

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/opencontainers/go-digest"
)

// fakeGeneration is a sealed RAM generation: content and the pages
// written since the parent.
type fakeGeneration struct {
	*bytes.Reader
	pages []int64
}

func (g fakeGeneration) Pages() []int64 { return g.pages }

// countingReader counts what Write reads.
type countingReader struct {
	fakeGeneration
	read int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.read += int64(len(p))
	return c.fakeGeneration.ReadAt(p, off)
}

// ramChain is a chain of incremental RAM snapshots in one store, with a
// model of each place's base content to check the writer's choices.
type ramChain struct {
	t     *testing.T
	store *memStore
	opts  WriteOptions
	ropts ReadOptions
	ram   []byte
	// base is the raw content of the full chunk that place's layer is (or
	// is a delta against); baseDigest its digest.
	base       map[int64][]byte
	baseDigest map[int64]digest.Digest
	parent     *Parent
	gen        int
}

const chainCS = testCS

func newRAMChain(t *testing.T, key []byte) *ramChain {
	c := &ramChain{t: t, store: newMemStore(), base: map[int64][]byte{}, baseDigest: map[int64]digest.Digest{}}
	c.opts = WriteOptions{ChunkSize: chainCS, EncryptionKey: key}
	c.ropts = ReadOptions{DecryptionKey: key}
	// 48 chunks: random, text, zeros, half random; the last one short.
	c.ram = make([]byte, 48*chainCS-3*PageSize)
	r := rand.New(rand.NewPCG(1, 2))
	for off := int64(0); off < int64(len(c.ram)); off += chainCS {
		b := c.ram[off:min(off+chainCS, int64(len(c.ram)))]
		switch off / chainCS % 4 {
		case 0:
			fillRandom(r, b)
		case 1:
			textLike(r, b)
		case 3:
			fillRandom(r, b[:len(b)/2])
		}
	}
	src := &Source{Metadata: Metadata{}, Files: []SourceFile{BytesSourceFile(FileRAM, c.ram), BytesSourceFile(FileDevState, []byte("device state 0"))}}
	_, st, err := Write(context.Background(), c.store, "g0", src, c.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("generation 0: %d chunks, %d bytes uploaded", st.Chunks, st.UploadedBytes)
	c.check("g0")
	return c
}

// check opens ref, verifies it, reads its RAM back byte-exact, updates the
// model of bases and takes it as the next parent.
func (c *ramChain) check(ref string) *Snapshot {
	t := c.t
	t.Helper()
	s := open(t, c.store, ref, c.ropts)
	if _, err := s.Verify(context.Background()); err != nil {
		t.Fatalf("%s: %v", ref, err)
	}
	got, err := s.ReadFile(context.Background(), FileRAM, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, c.ram) {
		t.Fatalf("%s: RAM read back differs from what was written", ref)
	}
	chunks := s.FileChunks(FileRAM)
	if n := len(s.Manifest.Layers); n > 2*len(chunks)+2 {
		t.Errorf("%s: %d layers for %d RAM chunks", ref, n, len(chunks))
	}
	for _, ch := range chunks {
		switch {
		case ch.Base == nil:
			c.base[ch.Offset] = slices.Clone(c.ram[ch.Offset : ch.Offset+ch.Size])
			c.baseDigest[ch.Offset] = ch.Stored.Digest
		case ch.Base.Digest != c.baseDigest[ch.Offset]:
			t.Errorf("%s: chunk at %d is a delta against %s, its place's full chunk is %s", ref, ch.Offset, ch.Base.Digest, c.baseDigest[ch.Offset])
		}
	}
	c.parent = ParentOf(s, FileRAM)
	return s
}

// next writes pages (random content) and checkpoints the result.
func (c *ramChain) next(pages []int64) (WriteStats, *countingReader) {
	t := c.t
	t.Helper()
	c.gen++
	r := rand.New(rand.NewPCG(uint64(c.gen), 3))
	for _, pg := range pages {
		off := pg * PageSize
		fillRandom(r, c.ram[off:min(off+PageSize, int64(len(c.ram)))])
	}
	gen := &countingReader{fakeGeneration: fakeGeneration{bytes.NewReader(slices.Clone(c.ram)), pages}}
	src := &Source{Files: []SourceFile{IncrementalSourceFile(FileRAM, gen, c.parent),
		BytesSourceFile(FileDevState, []byte("device state "+itoa(int64(c.gen))))}}
	pushed := c.store.pushedBytes.Load()
	ref := "g" + itoa(int64(c.gen))
	_, st, err := Write(context.Background(), c.store, ref, src, c.opts)
	if err != nil {
		t.Fatalf("%s: %v", ref, err)
	}
	if got := c.store.pushedBytes.Load() - pushed; got != st.UploadedBytes {
		t.Errorf("%s: store received %d bytes, stats say %d uploaded", ref, got, st.UploadedBytes)
	}
	return st, gen
}

// diffBytes is what the chunks with written pages should upload: the
// pages that differ from their base, or the whole chunk when it has no
// base or a delta would not pay.
func (c *ramChain) diffBytes(pages []int64) int64 {
	var n int64
	seen := map[int64]bool{}
	for _, pg := range pages {
		off := pg * PageSize / chainCS * chainCS
		if seen[off] {
			continue
		}
		seen[off] = true
		cur := c.ram[off:min(off+chainCS, int64(len(c.ram)))]
		b := c.base[off]
		if b == nil {
			n += int64(len(cur))
			continue
		}
		var d int64
		for s := int64(0); s < int64(len(cur)); s += PageSize {
			e := min(s+PageSize, int64(len(cur)))
			if !bytes.Equal(cur[s:e], b[s:e]) {
				d += e - s
			}
		}
		if d*maxDeltaShare > int64(len(cur)) {
			d = int64(len(cur))
		}
		n += d
	}
	return n
}

func dirtyChunks(pages []int64) int {
	m := map[int64]bool{}
	for _, pg := range pages {
		m[pg*PageSize/chainCS] = true
	}
	return len(m)
}

// TestIncrementalChain: 20 generations of random page writes over a
// served RAM; each reads back byte-exact, verifies, reads and uploads only
// the written chunks, and uploads about the bytes that differ from the
// chunks' bases.
func TestIncrementalChain(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "encrypted"}[enc], func(t *testing.T) {
			var key []byte
			depth := 20
			if enc {
				key, depth = bytes.Repeat([]byte{9}, 32), 8
			}
			c := newRAMChain(t, key)
			npages := (int64(len(c.ram)) + PageSize - 1) / PageSize
			hot := []int64{3, 4, 17, 70, 71, 200, 333, npages - 1} // rewritten every generation
			r := rand.New(rand.NewPCG(5, 5))
			for g := 1; g <= depth; g++ {
				pages := slices.Clone(hot)
				for range 6 { // and a few fresh pages, anywhere (zeros too)
					pages = append(pages, r.Int64N(npages))
				}
				slices.Sort(pages)
				pages = slices.Compact(pages)
				parentChunks := len(c.parent.Chunks)
				st, gen := c.next(pages)
				want := c.diffBytes(pages) // before check: the model's bases are the parent's
				c.check("g" + itoa(int64(g)))
				changed := int64(len(pages)) * PageSize
				t.Logf("generation %d: %d pages written (%d B), uploaded %d B (%.2fx), %d deltas, %d reused, read %d B",
					g, len(pages), changed, st.UploadedBytes, float64(st.UploadedBytes)/float64(changed), st.Deltas, st.Reused, gen.read)
				if max := int64(float64(want)*1.2) + 8<<10; st.UploadedBytes > max {
					t.Errorf("generation %d uploaded %d bytes, the pages that differ from the bases are %d", g, st.UploadedBytes, want)
				}
				if want := int64(dirtyChunks(pages)) * chainCS; gen.read > want {
					t.Errorf("generation %d read %d bytes, %d chunks were written (%d bytes)", g, gen.read, dirtyChunks(pages), want)
				}
				if st.ParentMissing != 0 {
					t.Errorf("generation %d: %d chunks without parent", g, st.ParentMissing)
				}
				if st.DirtyBytes != changed {
					t.Errorf("generation %d: %d dirty bytes, %d written", g, st.DirtyBytes, changed)
				}
				if st.Reused < parentChunks-dirtyChunks(pages) {
					t.Errorf("generation %d reused %d chunks of %d, %d were written", g, st.Reused, parentChunks, dirtyChunks(pages))
				}
			}
		})
	}
}

// TestIncrementalHotSetUploadsWhatChanged: a guest that rewrites the same
// pages every generation uploads about what it wrote, at any depth.
func TestIncrementalHotSetUploadsWhatChanged(t *testing.T) {
	c := newRAMChain(t, nil)
	var hot []int64
	for pg := int64(0); pg < 40; pg++ {
		hot = append(hot, pg*37%int64(len(c.ram)/PageSize))
	}
	slices.Sort(hot)
	for g := 1; g <= 20; g++ {
		st, _ := c.next(hot)
		c.check("g" + itoa(int64(g)))
		changed := int64(len(hot)) * PageSize
		if g > 1 && float64(st.UploadedBytes) > 1.2*float64(changed) {
			t.Errorf("generation %d uploaded %d bytes for %d bytes written (%.2fx)", g, st.UploadedBytes, changed, float64(st.UploadedBytes)/float64(changed))
		}
	}
}

// TestIncrementalParentMissing: chunks whose parent blobs left the store
// are read and stored full, and the stats say how many.
func TestIncrementalParentMissing(t *testing.T) {
	c := newRAMChain(t, nil)
	c.next([]int64{1, 2, 20})
	s := c.check("g1")
	gone := 0
	for _, ch := range s.FileChunks(FileRAM) {
		if ch.Offset/chainCS%3 == 0 {
			c.store.remove(ch.Stored.Digest)
			gone++
		}
	}
	st, _ := c.next([]int64{5})
	if st.ParentMissing < gone-1 || st.ParentMissing > gone {
		t.Errorf("%d parent chunks removed, stats say %d missing", gone, st.ParentMissing)
	}
	c.check("g2")

	// Its removed bases are in the store again: the next one is incremental.
	parentChunks := len(c.parent.Chunks)
	st, _ = c.next([]int64{6})
	if st.ParentMissing != 0 || st.Reused < parentChunks-1 {
		t.Errorf("after a full write: %d missing, %d reused", st.ParentMissing, st.Reused)
	}
	c.check("g3")
}

// TestIncrementalParentMismatch: a parent of another chunk size or key is
// not reused.
func TestIncrementalParentMismatch(t *testing.T) {
	c := newRAMChain(t, nil)
	c.opts.EncryptionKey = bytes.Repeat([]byte{1}, 32)
	c.ropts.DecryptionKey = c.opts.EncryptionKey
	parentChunks := len(c.parent.Chunks)
	st, _ := c.next([]int64{1})
	if st.Reused != 0 || st.Deltas != 0 || st.ParentMissing != parentChunks {
		t.Errorf("parent of another key: %d reused, %d deltas, %d missing", st.Reused, st.Deltas, st.ParentMissing)
	}
	c.check("g1")

	bad := *c.parent
	bad.Chunks = slices.Clone(bad.Chunks)
	bad.Chunks[0].Offset = 7
	c.parent = &bad
	st, _ = c.next([]int64{2})
	if st.Reused != 0 {
		t.Errorf("misplaced parent chunk: %d reused", st.Reused)
	}
	c.check("g2")
}

func (m *memStore) remove(d digest.Digest) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.blobs, d)
}

// TestIncrementalParentReads: parent chunks are read from ParentReads
// (the node cache), never from the target store, which is only asked
// whether it has them.
func TestIncrementalParentReads(t *testing.T) {
	c := newRAMChain(t, nil)
	cache := newMemStore()
	c.store.mu.Lock()
	for d, b := range c.store.blobs {
		cache.blobs[d] = b
	}
	c.store.mu.Unlock()
	c.opts.ParentReads = cache
	fetches := c.store.fetches.Load()
	st, _ := c.next([]int64{1, 40, 100})
	if got := c.store.fetches.Load() - fetches; got != 0 || cache.fetches.Load() == 0 {
		t.Errorf("write fetched %d blobs from the target store, %d from ParentReads", got, cache.fetches.Load())
	}
	if st.Deltas == 0 {
		t.Error("no delta")
	}
	c.check("g1")
}
