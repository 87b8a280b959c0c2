package pagefs

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func baseFile(t *testing.T, size int) (*VerifiedFile, []byte) {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	p := filepath.Join(t.TempDir(), "base")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	digests, err := ChunkDigests(bytes.NewReader(data), 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifiedFile(f, 64<<10, digests)
	if err != nil {
		t.Fatal(err)
	}
	return v, data
}

func TestLayeredReadsBaseUntilWritten(t *testing.T) {
	base, data := baseFile(t, 256<<10)
	layer, err := os.Create(filepath.Join(t.TempDir(), "layer"))
	if err != nil {
		t.Fatal(err)
	}
	defer layer.Close()
	if err := layer.Truncate(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	f, err := NewLayered("ram", base, layer)
	if err != nil {
		t.Fatal(err)
	}
	// A whole page, and a write that covers two pages in part.
	page := bytes.Repeat([]byte{0xaa}, PageSize)
	if _, err := f.WriteAt(page, 3*PageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("xyz"), 10*PageSize-1); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(data)
	copy(want[3*PageSize:], page)
	copy(want[10*PageSize-1:], "xyz")
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("layered view differs from base with the writes applied")
	}
	if d := f.DirtyPages(); !slices.Equal(d, []int64{3, 9, 10}) {
		t.Errorf("dirty pages %v, want [3 9 10]", d)
	}
	if st := f.Stats(); st.Writes != 2 || st.WriteBytes != PageSize+3 {
		t.Errorf("stats %+v", st)
	}
}

func TestReadOnlyRefusesWrites(t *testing.T) {
	base, _ := baseFile(t, 64<<10)
	f := NewReadOnly("ram", base)
	if _, err := f.WriteAt([]byte{1}, 0); !errors.Is(err, errReadOnly) {
		t.Errorf("write to a read-only file: %v", err)
	}
}

func TestLayerOfWrongSizeIsRefused(t *testing.T) {
	base, _ := baseFile(t, 64<<10)
	layer, err := os.Create(filepath.Join(t.TempDir(), "layer"))
	if err != nil {
		t.Fatal(err)
	}
	defer layer.Close()
	if _, err := NewLayered("ram", base, layer); err == nil {
		t.Error("an empty layer for a 64 KiB base was accepted")
	}
}

func TestVerifiedFileRefusesACorruptChunk(t *testing.T) {
	data := make([]byte, 128<<10)
	rand.Read(data)
	digests, _ := ChunkDigests(bytes.NewReader(data), 64<<10)
	data[70<<10] ^= 1 // chunk 1
	p := filepath.Join(t.TempDir(), "base")
	os.WriteFile(p, data, 0o600)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := NewVerifiedFile(f, 64<<10, digests)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, PageSize)
	if _, err := v.ReadAt(buf, 0); err != nil {
		t.Errorf("intact chunk 0: %v", err)
	}
	if n, err := v.ReadAt(buf, 64<<10); err == nil || n != 0 {
		t.Errorf("corrupt chunk 1: %d bytes, %v; want 0 bytes and an error", n, err)
	}
	if got := v.Order(); !slices.Equal(got, []int64{0}) {
		t.Errorf("verified chunks %v, want [0]", got)
	}
}

func TestGenerationReadsTheSealedContent(t *testing.T) {
	base, data := baseFile(t, 128<<10)
	dir := t.TempDir()
	layer, _ := os.Create(filepath.Join(dir, "layer"))
	defer layer.Close()
	layer.Truncate(int64(len(data)))
	f, err := NewLayered("ram", base, layer)
	if err != nil {
		t.Fatal(err)
	}
	one, two := bytes.Repeat([]byte{1}, PageSize), bytes.Repeat([]byte{2}, PageSize)
	f.WriteAt(one, 1*PageSize)
	f.WriteAt(one, 2*PageSize)
	side, _ := os.Create(filepath.Join(dir, "side"))
	defer side.Close()
	g, err := f.Seal(side)
	if err != nil {
		t.Fatal(err)
	}
	sealed := slices.Clone(data)
	copy(sealed[1*PageSize:], one)
	copy(sealed[2*PageSize:], one)
	if _, err := f.Seal(side); err == nil {
		t.Error("a second Seal with a generation open succeeded")
	}
	// The guest runs on: it rewrites a sealed page and writes a base page.
	f.WriteAt(two, 2*PageSize)
	f.WriteAt(two, 5*PageSize)
	got := make([]byte, len(data))
	if _, err := g.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sealed) {
		t.Error("the generation does not read the content at Seal")
	}
	if !slices.Equal(g.Pages(), []int64{1, 2}) || !slices.Equal(f.DirtyPages(), []int64{2, 5}) {
		t.Errorf("generation pages %v (want [1 2]), dirty since %v (want [2 5])", g.Pages(), f.DirtyPages())
	}
	now := slices.Clone(sealed)
	copy(now[2*PageSize:], two)
	copy(now[5*PageSize:], two)
	f.ReadAt(got, 0)
	if !bytes.Equal(got, now) {
		t.Error("the file does not read its latest content")
	}
	g.Close()
	if _, err := f.Seal(side); err != nil {
		t.Errorf("Seal after Close: %v", err)
	}
}
