package servedram

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/pagefs"
	"github.com/cryo-runtime/cryo/snapshot"
)

// TestServeZero: a booted sandbox's served RAM reads as zeros, keeps what
// the guest writes (in the layer, the dirty set), seals it for a
// checkpoint whose parent is all zeros, and leaves nothing once closed.
func TestServeZero(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("pagefs mounts need root: run go test as root")
	}
	dir := t.TempDir()
	layer := filepath.Join(dir, "cryo-test.layer")
	const size = 4 << 20
	o := Options{StateDir: dir, Layer: layer, PageTimeout: time.Second, StuckGrace: time.Second}
	r, err := ServeZero(t.Context(), size, o)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	r.Admit(12345)
	r.SetKill(func() { t.Error("a zero ram killed the vm") })

	f, err := os.OpenFile(r.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, size)
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, make([]byte, size)) {
		t.Fatalf("a booted ram reads other than zeros (%v)", err)
	}
	pattern := bytes.Repeat([]byte("cryo"), pagefs.PageSize/4)
	for _, pg := range []int64{3, 700} {
		if _, err := f.WriteAt(pattern, pg*pagefs.PageSize); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.PreSync(); err != nil {
		t.Fatal(err)
	}
	if err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	gen, err := r.Seal()
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()
	if !slices.Equal(gen.Pages(), []int64{3, 700}) {
		t.Errorf("dirty set %v, want the two pages written", gen.Pages())
	}
	if _, err := gen.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	copy(want[3*pagefs.PageSize:], pattern)
	copy(want[700*pagefs.PageSize:], pattern)
	if !bytes.Equal(got, want) {
		t.Error("the sealed generation is not the pages written over zeros")
	}
	if st, err := os.Stat(layer); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("layer %v (%v), want root-only", st, err)
	}

	// The first checkpoint's parent is all zeros at the write's chunk size.
	plain := snapshot.WriteOptions{ChunkSize: 64 << 10}
	if p := r.WriteParent(plain); p == nil || p.ChunkSize != 64<<10 || len(p.Chunks) != 0 || p.KeyID != "" || p.Lineage != "" {
		t.Errorf("zero parent %+v", p)
	}
	key := bytes.Repeat([]byte{7}, 32)
	if p := r.WriteParent(snapshot.WriteOptions{ChunkSize: 64 << 10, EncryptionKey: key}); p != nil {
		t.Errorf("an encrypted write of unknown lineage got parent %+v: it cannot fit", p)
	}
	lineage := snapshot.NewLineage()
	if p := r.WriteParent(snapshot.WriteOptions{ChunkSize: 64 << 10, EncryptionKey: key, Lineage: lineage}); p == nil || p.KeyID != snapshot.KeyID(key) || p.Lineage != lineage {
		t.Errorf("zero parent of an encrypted write %+v", p)
	}
	// A checkpoint lost after its seal: its pages are dirty again, so the
	// parent stays zeros.
	r.LostGeneration(t.Context(), gen)
	if p := r.WriteParent(plain); p == nil || p.ChunkSize != 64<<10 || len(p.Chunks) != 0 {
		t.Errorf("after a lost generation the parent is %+v, want zeros", p)
	}
	if d := r.file.DirtyPages(); !slices.Equal(d, []int64{3, 700}) {
		t.Errorf("after a lost generation the dirty set is %v, want the two pages written", d)
	}

	f.Close()
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{layer, filepath.Join(dir, servedRecord), filepath.Join(dir, "pagefs")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after Close: %v", p, err)
		}
	}
}

// TestServeZeroRefuses: a size that is not whole pages or a missing page
// timeout is refused, and nothing is left.
func TestServeZeroRefuses(t *testing.T) {
	dir := t.TempDir()
	layer := filepath.Join(dir, "cryo-test.layer")
	for _, c := range []struct {
		size int64
		o    Options
	}{
		{4<<20 + 1, Options{StateDir: dir, Layer: layer, PageTimeout: time.Second, StuckGrace: time.Second}},
		{0, Options{StateDir: dir, Layer: layer, PageTimeout: time.Second, StuckGrace: time.Second}},
		{4 << 20, Options{StateDir: dir, Layer: layer}},
	} {
		if _, err := ServeZero(t.Context(), c.size, c.o); err == nil {
			t.Errorf("served ram of %d bytes, timeout %s accepted", c.size, c.o.PageTimeout)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused ram left %v", ents)
	}
}

// TestZeroReader: the zero source reads zeros up to its size.
func TestZeroReader(t *testing.T) {
	z := zeroReader{size: 3 * pagefs.PageSize}
	p := bytes.Repeat([]byte{1}, 2*pagefs.PageSize)
	if n, err := z.ReadAtContext(t.Context(), p, 0); n != len(p) || err != nil || !bytes.Equal(p, make([]byte, len(p))) {
		t.Errorf("read %d (%v), want zeros", n, err)
	}
	p = bytes.Repeat([]byte{1}, 2*pagefs.PageSize)
	if n, err := z.ReadAtContext(t.Context(), p, 2*pagefs.PageSize); n != pagefs.PageSize || err == nil || !bytes.Equal(p[:n], make([]byte, n)) {
		t.Errorf("read at the end %d (%v), want one page and EOF", n, err)
	}
}
