package servedram

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cryo-runtime/cryo/pagefs"
)

type zeroSource struct{ *bytes.Reader }

func (z zeroSource) Size() int64 { return z.Reader.Size() }

// unmounted is a RAM of pages pages over zeros whose layer is in dir, with
// no mount (FromFile): the test plays the kernel's writeback.
func unmounted(t *testing.T, dir string, pages int64) *RAM {
	t.Helper()
	layer := filepath.Join(dir, "cryo-test.layer")
	lf, err := os.OpenFile(layer, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lf.Close() })
	if err := lf.Truncate(pages * pagefs.PageSize); err != nil {
		t.Fatal(err)
	}
	f, err := pagefs.NewLayered("ram", zeroSource{bytes.NewReader(make([]byte, pages*pagefs.PageSize))}, lf)
	if err != nil {
		t.Fatal(err)
	}
	return FromFile(f, layer, Parent{Zero: true})
}

// writeBack writes n pages from page first into r's file, as a pass of
// the kernel's writeback does.
func writeBack(t *testing.T, r *RAM, first, n int64) {
	t.Helper()
	page := bytes.Repeat([]byte{1}, pagefs.PageSize)
	for pg := first; pg < first+n; pg++ {
		if _, err := r.file.WriteAt(page, pg*pagefs.PageSize); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSyncInThePauseIsOneFsync: before the pause PreSync fsyncs pass after
// pass while the passes shrink; in the pause Sync fsyncs once, however
// much that pass wrote (before, Sync ran PreSync's loop in the pause too,
// a second fsync after a pass of more than 1 MiB).
func TestSyncInThePauseIsOneFsync(t *testing.T) {
	r := unmounted(t, t.TempDir(), 4096)
	defer r.Close(t.Context())
	var passes []int64 // pages each fsync writes back
	calls := 0
	r.fsync = func() error {
		if calls < len(passes) {
			writeBack(t, r, 0, passes[calls])
		}
		calls++
		return nil
	}
	// The guest runs: 2 MiB, 1.5 MiB, then 400 KiB, settled.
	passes = []int64{512, 384, 100, 50}
	if err := r.PreSync(); err != nil {
		t.Fatal(err)
	}
	if calls != 3 {
		t.Errorf("PreSync made %d fsyncs, want 3 (until a pass wrote under 1 MiB)", calls)
	}
	// The guest stopped: 1.2 MiB dirtied since, then nothing.
	passes, calls = []int64{300, 0}, 0
	if err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("Sync in the pause made %d fsyncs, want 1", calls)
	}
	g, err := r.Seal()
	if err != nil {
		t.Fatal(err)
	}
	r.LostGeneration(t.Context(), g)
}

// sideFiles counts the open side files of layer (they are unlinked at
// once: only their descriptors show them).
func sideFiles(t *testing.T, layer string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(l, filepath.Base(layer)+".side-") {
			n++
		}
	}
	return n
}

// TestSealCreatesNothing: the side file of a generation is made by
// PreSync, before the pause; Seal only takes it (it seals with the
// layer's directory gone, where it used to create the file), refuses
// without one, and every way a checkpoint ends drops it: published,
// lost, refused, or the RAM closed.
func TestSealCreatesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shm")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := unmounted(t, dir, 256)
	defer r.Close(t.Context())
	if _, err := r.Seal(); err == nil {
		t.Fatal("Seal without PreSync succeeded")
	}
	if n := sideFiles(t, r.layer); n != 0 {
		t.Errorf("a refused Seal left %d side files", n)
	}

	writeBack(t, r, 3, 2)
	if err := r.PreSync(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 || sideFiles(t, r.layer) != 1 {
		t.Errorf("PreSync left %v in the layer's directory and %d side files open; want the layer and one unlinked side file", ents, sideFiles(t, r.layer))
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	g, err := r.Seal() // nothing to create
	if err != nil {
		t.Fatalf("Seal with the layer's directory gone: %v", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeBack(t, r, 10, 1) // during the upload: copied to the side file first

	// The next checkpoint starts before this one ended: its Seal is
	// refused, the side file it readied dropped as it fails.
	if err := r.PreSync(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Seal(); err == nil {
		t.Fatal("a second Seal with a generation open succeeded")
	}
	if n := sideFiles(t, r.layer); n != 2 {
		t.Errorf("%d side files open, want the generation's and the one readied", n)
	}
	r.LostGeneration(t.Context(), nil)
	if n := sideFiles(t, r.layer); n != 1 {
		t.Errorf("the refused checkpoint left %d side files, want the open generation's", n)
	}

	// The first checkpoint is lost: its side file is dropped, its pages
	// are dirty again.
	r.LostGeneration(t.Context(), g)
	if n := sideFiles(t, r.layer); n != 0 {
		t.Errorf("a lost generation left %d side files", n)
	}
	if d := r.file.DirtyPages(); !slices.Equal(d, []int64{3, 4, 10}) {
		t.Errorf("dirty after a lost checkpoint %v, want [3 4 10]", d)
	}

	// Published: the generation is closed and its side file dropped.
	if err := r.PreSync(); err != nil {
		t.Fatal(err)
	}
	if g, err = r.Seal(); err != nil {
		t.Fatal(err)
	}
	r.endGeneration(g, true)
	if n := sideFiles(t, r.layer); n != 0 || len(r.file.DirtyPages()) != 0 {
		t.Errorf("a published generation left %d side files, %d dirty pages", n, len(r.file.DirtyPages()))
	}

	// Readied, then the RAM closes.
	if err := r.PreSync(); err != nil {
		t.Fatal(err)
	}
	r.Close(t.Context())
	if n := sideFiles(t, r.layer); n != 0 {
		t.Errorf("Close left %d side files", n)
	}
}
