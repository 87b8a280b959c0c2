package pagefs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
)

// layeredOver is a layered file of size bytes over zeros, its layer in a
// temporary directory, and a side file for its generations.
func layeredOver(t testing.TB, size int64) (*File, *os.File) {
	t.Helper()
	dir := t.TempDir()
	layer, err := os.Create(filepath.Join(dir, "layer"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.Close() })
	if err := layer.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f, err := NewLayered("ram", zeroSource(size), layer)
	if err != nil {
		t.Fatal(err)
	}
	side, err := os.Create(filepath.Join(dir, "side"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { side.Close() })
	return f, side
}

// Seal runs in the pause: what it allocates must not grow with the file.
// Sealing a 4 GiB file with 4096 dirty pages allocated 256 KiB of bitmaps
// and 32 KiB of page list before Seal was made O(1).
func TestSealAllocatesNothingSizedToTheFile(t *testing.T) {
	f, side := layeredOver(t, 4<<30)
	page := make([]byte, PageSize)
	for pg := int64(0); pg < 1<<20; pg += 256 {
		if _, err := f.WriteAt(page, pg*PageSize); err != nil {
			t.Fatal(err)
		}
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	g, err := f.Seal(side)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if n := after.TotalAlloc - before.TotalAlloc; n > 8<<10 {
		t.Errorf("Seal of a 4 GiB file allocated %d bytes", n)
	}
	if n := len(g.Pages()); n != 4096 {
		t.Errorf("%d pages sealed, want 4096", n)
	}
}

func TestDirtyCountIsExact(t *testing.T) {
	f, side := layeredOver(t, 64*PageSize+100) // a last page in part
	check := func(when string, want []int64) {
		t.Helper()
		if got := f.DirtyPages(); !slices.Equal(got, want) {
			t.Errorf("%s: dirty pages %v, want %v", when, got, want)
		}
		if n := f.DirtyCount(); n != int64(len(want)) {
			t.Errorf("%s: DirtyCount %d, want %d", when, n, len(want))
		}
	}
	check("new", []int64{})
	write := func(p []byte, off int64) {
		t.Helper()
		if _, err := f.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
	}
	write(make([]byte, PageSize), 3*PageSize)
	write(make([]byte, PageSize), 3*PageSize) // rewritten: counted once
	write([]byte("xy"), 8*PageSize-1)         // two pages in part
	write(make([]byte, 3*PageSize), 20*PageSize)
	write([]byte("end"), 64*PageSize+97) // the last, short page
	check("written", []int64{3, 7, 8, 20, 21, 22, 64})
	g, err := f.Seal(side)
	if err != nil {
		t.Fatal(err)
	}
	check("sealed", []int64{})
	write([]byte("z"), 8*PageSize) // sealed before, dirty again
	write(make([]byte, PageSize), 40*PageSize)
	check("written after the seal", []int64{8, 40})
	if p := g.Pages(); !slices.Equal(p, []int64{3, 7, 8, 20, 21, 22, 64}) {
		t.Errorf("generation pages %v", p)
	}
	g.Close()
	write(make([]byte, PageSize), 41*PageSize)
	check("after Close", []int64{8, 40, 41})
}

// Close hands the generation's bitmap to the next Seal: a generation read
// after it would read the wrong pages from side, so it is refused, and
// Pages still answers what was sealed.
func TestClosedGenerationRefusesReads(t *testing.T) {
	f, side := layeredOver(t, 16*PageSize)
	f.WriteAt(bytes.Repeat([]byte{1}, PageSize), 2*PageSize)
	g, err := f.Seal(side)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	g.Close() // twice: no effect
	if _, err := g.ReadAt(make([]byte, PageSize), 0); !errors.Is(err, errClosed) {
		t.Errorf("read of a closed generation: %v", err)
	}
	if p := g.Pages(); !slices.Equal(p, []int64{2}) {
		t.Errorf("pages after Close %v, want [2]", p)
	}
	if _, err := f.Seal(side); err != nil {
		t.Errorf("Seal after a double Close: %v", err)
	}
}

// The guest writes while the checkpoint seals, lists and reads: each
// writer owns its own pages and numbers its writes, so the content at
// Seal is the writes each writer made before it (a prefix of each one's
// log), and a generation's dirty set is exactly the pages written between
// its seal and the one before. Run with -race.
func TestGenerationsUnderConcurrentWrites(t *testing.T) {
	const (
		pages   = 512
		writers = 4
		gens    = 4
	)
	f, side := layeredOver(t, pages*PageSize)
	logs := make([][]int64, writers) // page of each writer's write n+1
	logMu := make([]sync.Mutex, writers)
	logOf := func(w int) []int64 {
		logMu[w].Lock()
		defer logMu[w].Unlock()
		return slices.Clone(logs[w])
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			// xorshift: reproducible, no lock shared with the other writers
			x := uint64(w + 1)
			for seq := uint64(1); ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				pg := int64(x%(pages/writers))*writers + int64(w)
				// The log holds a write as soon as the file does.
				logMu[w].Lock()
				_, err := f.WriteAt(pageOf(pg, seq), pg*PageSize)
				logs[w] = append(logs[w], pg)
				logMu[w].Unlock()
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	done := make([]int, writers) // writes of each writer in earlier generations
	for gen := range gens {
		waitForWrites(f, int64(50*(gen+1)))
		g, err := f.Seal(side)
		if err != nil {
			t.Fatal(err)
		}
		var pagesRace []int64
		listed := make(chan struct{})
		go func() { pagesRace = g.Pages(); close(listed) }()
		got := make([]byte, pages*PageSize)
		if _, err := g.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		again := make([]byte, len(got))
		waitForWrites(f, 20)
		if _, err := g.ReadAt(again, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, again) {
			t.Errorf("generation %d: the content changed with writes after the seal", gen)
		}
		<-listed
		// Each writer's last write before the seal is the highest number
		// in its pages; every page of it shows its last write up to there.
		seen := map[int64]bool{}
		for w := range writers {
			last := uint64(0)
			for pg := int64(w); pg < pages; pg += writers {
				last = max(last, binary.LittleEndian.Uint64(got[pg*PageSize+8:]))
			}
			log := logOf(w)
			want := make([]byte, pages*PageSize)
			for n, pg := range log[:last] {
				copy(want[pg*PageSize:], pageOf(pg, uint64(n+1)))
			}
			for pg := int64(w); pg < pages; pg += writers {
				if !bytes.Equal(got[pg*PageSize:(pg+1)*PageSize], want[pg*PageSize:(pg+1)*PageSize]) {
					t.Fatalf("generation %d: page %d is not writer %d's write %d or earlier", gen, pg, w, last)
				}
			}
			for _, pg := range log[done[w]:last] {
				seen[pg] = true
			}
			done[w] = int(last)
		}
		want := slices.Sorted(func(yield func(int64) bool) {
			for pg := range seen {
				if !yield(pg) {
					return
				}
			}
		})
		if p := g.Pages(); !slices.Equal(p, want) || !slices.Equal(pagesRace, want) {
			t.Errorf("generation %d: pages %v, want the %d written since the last seal %v", gen, p, len(want), want)
		}
		g.Close()
	}
	close(stop)
	wg.Wait()
	// The writes after the last seal are the dirty set, exactly.
	seen := map[int64]bool{}
	for w := range writers {
		for _, pg := range logs[w][done[w]:] {
			seen[pg] = true
		}
	}
	if d := f.DirtyPages(); len(d) != len(seen) || int64(len(d)) != f.DirtyCount() {
		t.Errorf("dirty since the last seal: %d pages, DirtyCount %d, want %d", len(d), f.DirtyCount(), len(seen))
	}
	for _, pg := range f.DirtyPages() {
		if !seen[pg] {
			t.Errorf("page %d dirty, not written since the last seal", pg)
		}
	}
}

// pageOf is write seq's content of page pg: its index and the number,
// then a pattern of both, so that a torn or misplaced page shows.
func pageOf(pg int64, seq uint64) []byte {
	p := make([]byte, PageSize)
	binary.LittleEndian.PutUint64(p, uint64(pg))
	binary.LittleEndian.PutUint64(p[8:], seq)
	for i := 16; i < PageSize; i++ {
		p[i] = byte(uint64(pg)*31 + seq*7 + uint64(i))
	}
	return p
}

// waitForWrites returns once the writers made n more writes.
func waitForWrites(f *File, n int64) {
	for start := f.Stats().Writes; f.Stats().Writes < start+n; {
		runtime.Gosched()
	}
}

// A generation's dirty sets over three seals: each holds the pages
// written between its seal and the one before, whatever was written
// before or after, and each reads its own content.
func TestDirtySetsAcrossThreeGenerations(t *testing.T) {
	f, side := layeredOver(t, 32*PageSize)
	content := make([]byte, 32*PageSize)
	write := func(pg int64, b byte) {
		t.Helper()
		p := bytes.Repeat([]byte{b}, PageSize)
		if _, err := f.WriteAt(p, pg*PageSize); err != nil {
			t.Fatal(err)
		}
		copy(content[pg*PageSize:], p)
	}
	writes := [][]int64{{1, 5, 9}, {5, 6, 30}, {1, 2, 30, 31}}
	for gen, pgs := range writes {
		for _, pg := range pgs {
			write(pg, byte(10*gen+int(pg)))
		}
		g, err := f.Seal(side)
		if err != nil {
			t.Fatal(err)
		}
		at := slices.Clone(content)
		write(pgs[0], 0xee) // after the seal
		write(0, 0xee)
		got := make([]byte, len(at))
		if _, err := g.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, at) {
			t.Errorf("generation %d does not read its content at the seal", gen)
		}
		want := slices.Clone(pgs)
		if gen > 0 {
			// the two writes after the previous seal
			want = append(want, writes[gen-1][0], 0)
			slices.Sort(want)
			want = slices.Compact(want)
		}
		if p := g.Pages(); !slices.Equal(p, want) {
			t.Errorf("generation %d: pages %v, want %v", gen, p, want)
		}
		g.Close()
	}
}

// A failed checkpoint abandons its generation: the file's dirty set is
// then the generation's pages and those written since its seal, twice in a
// row, so the next generation holds everything written since the last one
// kept (Close). The abandoned generation reads no more, and its bitmap
// serves the next Seal.
func TestAbandonMergesTheDirtySets(t *testing.T) {
	f, side := layeredOver(t, 200*PageSize+100)
	write := func(pgs ...int64) {
		t.Helper()
		for _, pg := range pgs {
			if _, err := f.WriteAt([]byte{byte(pg)}, pg*PageSize+1); err != nil {
				t.Fatal(err)
			}
		}
	}
	seal := func() *Generation {
		t.Helper()
		g, err := f.Seal(side)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	check := func(when string, want []int64) {
		t.Helper()
		if got := f.DirtyPages(); !slices.Equal(got, want) || f.DirtyCount() != int64(len(want)) {
			t.Errorf("%s: dirty %v (DirtyCount %d), want %v", when, got, f.DirtyCount(), want)
		}
	}

	write(1, 2)
	seal().Close() // kept: published
	write(3, 64, 200)
	g := seal()
	write(3, 4, 130) // after the seal: 3 again, 4 and 130 new
	g.Abandon()
	check("after Abandon", []int64{3, 4, 64, 130, 200})
	if _, err := g.ReadAt(make([]byte, PageSize), 0); !errors.Is(err, errClosed) {
		t.Errorf("read of an abandoned generation: %v", err)
	}
	if p := g.Pages(); !slices.Equal(p, []int64{3, 64, 200}) {
		t.Errorf("abandoned generation's pages %v", p)
	}
	g.Close() // no effect: it would clear the merged pages
	g.Abandon()
	check("after Close and Abandon again", []int64{3, 4, 64, 130, 200})

	// Abandoned again: the union of both, and the writes since.
	g = seal()
	check("sealed", []int64{})
	write(5, 64)
	g.Abandon()
	check("after a second Abandon", []int64{3, 4, 5, 64, 130, 200})
	write(6)
	g = seal()
	if p := g.Pages(); !slices.Equal(p, []int64{3, 4, 5, 6, 64, 130, 200}) {
		t.Errorf("the generation after two abandoned: pages %v", p)
	}
	g.Close()
	check("kept", []int64{})
	// The spare the abandoned generations handed back is clear.
	write(7)
	if p := seal().Pages(); !slices.Equal(p, []int64{7}) {
		t.Errorf("a generation after Close: pages %v, want [7]", p)
	}
}
