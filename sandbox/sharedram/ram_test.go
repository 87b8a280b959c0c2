package sharedram

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/sandbox/servedram"
	"github.com/cryo-runtime/cryo/vmm/devstate"
)

// memfdBase is a Base of pages: page i holds fill(i), a nil fill a hole.
type memfdBase struct {
	f      *os.File
	closed bool
}

func (b *memfdBase) File() *os.File { return b.f }
func (b *memfdBase) Path() string   { return "/proc/self/fd/" }
func (b *memfdBase) Close() error   { b.closed = true; return b.f.Close() }

func newBase(t *testing.T, pages int, content func(i int) []byte) *memfdBase {
	t.Helper()
	fd, err := unix.MemfdCreate("cryo-test-base", unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "base")
	if err := f.Truncate(int64(pages) * PageSize); err != nil {
		t.Fatal(err)
	}
	for i := range pages {
		if b := content(i); b != nil {
			if _, err := f.WriteAt(b, int64(i)*PageSize); err != nil {
				t.Fatal(err)
			}
		}
	}
	return &memfdBase{f: f}
}

func page(b byte) []byte { return bytes.Repeat([]byte{b}, PageSize) }

// pattern is a page no fill can stand for.
func pattern(seed byte) []byte {
	p := page(seed)
	p[17] = seed + 1
	return p
}

// capture feeds c the RAM given by content, page by page, as a stream
// would (fills as fills).
func capture(t *testing.T, r *RAM, pages int, content func(i int) devstate.Page) *Capture {
	t.Helper()
	c, err := r.newCapture()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for i := range pages {
		p := content(i)
		p.Off = int64(i) * PageSize
		if err := c.page(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.finish(r.size); err != nil {
		t.Fatal(err)
	}
	return c
}

func idxs(pages ...int) []int64 {
	var out []int64
	for _, p := range pages {
		out = append(out, int64(p))
	}
	return out
}

// TestCaptureKeepsWhatDiffers takes two checkpoints of a clone: the
// first keeps and marks dirty exactly the pages that differ from the
// base; the second, against the first, marks only the pages changed
// since (one rewritten, one new, one written back to the base's content,
// one rewritten with the same bytes: not dirty), and both read back as
// the RAM at their pause, across page and hole boundaries.
func TestCaptureKeepsWhatDiffers(t *testing.T) {
	const n = 16
	baseOf := func(i int) []byte {
		switch {
		case i%4 == 0:
			return nil // hole
		case i%4 == 1:
			return page(byte(i))
		default:
			return pattern(byte(i))
		}
	}
	base := newBase(t, n, baseOf)
	r, err := New(base, n*PageSize, servedram.Parent{}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })

	asStream := func(b []byte) devstate.Page {
		if b == nil {
			return devstate.Page{Fill: 0}
		}
		if bytes.Equal(b, page(b[0])) {
			return devstate.Page{Fill: b[0]}
		}
		return devstate.Page{Data: b}
	}
	first := map[int][]byte{2: pattern(200), 4: pattern(201), 5: page(7), 8: page(9)}
	at := func(m map[int][]byte) func(i int) []byte {
		return func(i int) []byte {
			if b, ok := m[i]; ok {
				return b
			}
			return baseOf(i)
		}
	}
	c1 := capture(t, r, n, func(i int) devstate.Page { return asStream(at(first)(i)) })
	if got, want := c1.Pages(), idxs(2, 4, 5, 8); !slices.Equal(got, want) {
		t.Fatalf("first checkpoint dirty = %v, want %v", got, want)
	}
	checkReads(t, c1, n, at(first))

	if err := c1.sumRest(); err != nil { // published
		t.Fatal(err)
	}
	r.mu.Lock()
	r.own = c1.own
	r.mu.Unlock()
	second := map[int][]byte{2: pattern(202), 4: pattern(201), 5: page(7), 11: page(3)}
	// 8 went back to the base's (a hole: zeros); 4 and 5 rewritten the same.
	c2 := capture(t, r, n, func(i int) devstate.Page { return asStream(at(second)(i)) })
	if got, want := c2.Pages(), idxs(2, 8, 11); !slices.Equal(got, want) {
		t.Fatalf("second checkpoint dirty = %v, want %v", got, want)
	}
	if c2.OwnPages() != 4 {
		t.Errorf("second checkpoint keeps %d pages, want 4 (2, 4, 5, 11)", c2.OwnPages())
	}
	checkReads(t, c2, n, at(second))
}

// checkReads reads c whole in odd-sized pieces and compares with want.
func checkReads(t *testing.T, c *Capture, n int, want func(i int) []byte) {
	t.Helper()
	var all []byte
	for i := range n {
		b := want(i)
		if b == nil {
			b = make([]byte, PageSize)
		}
		all = append(all, b...)
	}
	got := make([]byte, len(all))
	for off := 0; off < len(all); off += 3000 {
		end := min(off+3000, len(all))
		if k, err := c.ReadAt(got[off:end], int64(off)); err != nil || k != end-off {
			t.Fatalf("ReadAt(%d) = %d, %v", off, k, err)
		}
	}
	if !bytes.Equal(got, all) {
		for i := range n {
			if !bytes.Equal(got[i*PageSize:(i+1)*PageSize], all[i*PageSize:(i+1)*PageSize]) {
				t.Fatalf("page %d reads wrong", i)
			}
		}
	}
}

// TestCaptureRefusesPartialStream refuses a stream that left a page out,
// or whose block is not the base's size, or a page outside the RAM.
func TestCaptureRefusesPartialStream(t *testing.T) {
	c := emptyCapture(t, 4)
	for _, off := range []int64{0, PageSize, 3 * PageSize} {
		if err := c.page(devstate.Page{Off: off}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.finish(4 * PageSize); err == nil || !strings.Contains(err.Error(), "3 of its 4 pages") {
		t.Errorf("finish with a page missing = %v", err)
	}
	if err := c.finish(8 * PageSize); err == nil || !strings.Contains(err.Error(), "has 32768 bytes") {
		t.Errorf("finish with a larger block = %v", err)
	}
	for _, off := range []int64{4 * PageSize, -PageSize, 100} {
		if err := c.page(devstate.Page{Off: off}); err == nil {
			t.Errorf("page at %d accepted", off)
		}
	}
}

// TestNewRefusesMismatchedBase refuses a base of another size than the
// RAM's, and closes the base with the RAM.
func TestNewRefusesMismatchedBase(t *testing.T) {
	base := newBase(t, 4, func(int) []byte { return nil })
	if _, err := New(base, 8*PageSize, servedram.Parent{}, t.TempDir()); err == nil || !strings.Contains(err.Error(), "base of 16384 bytes") {
		t.Errorf("New with a small base = %v", err)
	}
	if _, err := New(base, 100, servedram.Parent{}, t.TempDir()); err == nil {
		t.Error("New with an unaligned size accepted")
	}
	r, err := New(base, 4*PageSize, servedram.Parent{}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil || !base.closed {
		t.Errorf("Close = %v, base closed %v", err, base.closed)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

// TestCaptureRunsAndResends: kept pages longer than one run, and pages
// sent again (new content, or back to the base's), read back as their
// last copy.
func TestCaptureRunsAndResends(t *testing.T) {
	const n = 3*maxRun/PageSize + 7
	c := emptyCapture(t, n)
	want := map[int][]byte{}
	send := func(i int, b []byte) {
		t.Helper()
		if err := c.page(devstate.Page{Off: int64(i) * PageSize, Data: b}); err != nil {
			t.Fatal(err)
		}
		want[i] = b
	}
	for i := range n {
		send(i, pattern(byte(i)))
	}
	send(5, pattern(99))              // again, changed
	send(n-1, make([]byte, PageSize)) // again, as the base (zeros)
	send(n/2, pattern(98))            // again, inside a written run
	if err := c.finish(c.r.size); err != nil {
		t.Fatal(err)
	}
	if c.OwnPages() != n-1 {
		t.Errorf("%d pages kept, want %d", c.OwnPages(), n-1)
	}
	checkReads(t, c, n, func(i int) []byte { return want[i] })
}

// emptyCapture is a capture of a RAM of n pages over an empty base (all
// holes), with nothing fed yet.
func emptyCapture(t *testing.T, n int) *Capture {
	t.Helper()
	r, err := New(newBase(t, n, func(int) []byte { return nil }), int64(n)*PageSize, servedram.Parent{}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	c, err := r.newCapture()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
