package sharedram

import (
	"bytes"
	"fmt"
	"io"
	"math/bits"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/vmm/devstate"
)

// Block is the RAM block of cryo's guest RAM in QEMU's stream: the
// memory-backend-file object vmm names ram0.
const Block = "ram0"

// Capture is what a checkpoint took of the RAM in its pause: the pages
// that differ from the base, kept in an unnamed tmpfs file until they are
// written. It reads as the whole RAM at the pause (a snapshot.PageReader
// whose pages are those that differ from the parent).
type Capture struct {
	r     *RAM
	pages *os.File
	// own are the pages that differ from the base, by their sums. A sum
	// is taken in the pause only where the parent holds the page too (to
	// tell whether it changed); the others, dirty either way, are summed
	// from the pages file once published (unsummed).
	own      map[int64]pageSum
	unsummed []int64
	parent   map[int64]pageSum // the parent's own pages
	dirty    []int64           // page indexes, in order
	seen     []uint64
	fill     [PageSize]byte
	// run is the kept pages not yet written, from runOff: contiguous
	// pages go to the file in one write.
	run    []byte
	runOff int64
	stats  devstate.Stats
}

// maxRun is the most a run of kept pages holds before it is written.
const maxRun = 1 << 20

var zeroPage [PageSize]byte

// Split copies QEMU's device-state stream from state to out without the
// pages of the guest RAM, which it compares with the base as they come:
// the ones that differ are kept for the write. The stream must carry
// every page of the RAM once at least (a stopped VM's migration does).
func (r *RAM) Split(state io.Reader, out io.Writer) (_ *Capture, retErr error) {
	c, err := r.newCapture()
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			c.Close()
		}
	}()
	c.stats, err = devstate.Split(state, out, Block, c.page)
	if err != nil {
		return nil, fmt.Errorf("split guest ram from the device state: %w", err)
	}
	if err := c.finish(c.stats.BlockSize); err != nil {
		return nil, err
	}
	return c, nil
}

// newCapture is a capture with nothing kept yet.
func (r *RAM) newCapture() (*Capture, error) {
	fd, err := unix.Open(r.dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shared ram: pages file in %s: %w", r.dir, err)
	}
	r.mu.Lock()
	parent := r.own
	r.mu.Unlock()
	c := &Capture{r: r, pages: os.NewFile(uintptr(fd), "shared-ram-pages"), own: map[int64]pageSum{}, parent: parent,
		seen: make([]uint64, (r.size/PageSize+63)/64), run: make([]byte, 0, maxRun)}
	if err := c.pages.Truncate(r.size); err != nil {
		c.Close()
		return nil, fmt.Errorf("shared ram: pages file: %w", err)
	}
	return c, nil
}

// keep adds a page that differs from the base to the run, writing the
// run first if the page does not extend it.
func (c *Capture) keep(off int64, content []byte) error {
	if len(c.run) > 0 && (off != c.runOff+int64(len(c.run)) || len(c.run) == maxRun) {
		if err := c.flush(); err != nil {
			return err
		}
	}
	if len(c.run) == 0 {
		c.runOff = off
	}
	c.run = append(c.run, content...)
	return nil
}

func (c *Capture) flush() error {
	if len(c.run) == 0 {
		return nil
	}
	if _, err := c.pages.WriteAt(c.run, c.runOff); err != nil {
		return fmt.Errorf("keep pages at %d: %w", c.runOff, err)
	}
	c.run = c.run[:0]
	return nil
}

// finish checks that the stream's block (blockSize bytes) was the whole
// RAM, every page of it, and finds what changed since the parent.
func (c *Capture) finish(blockSize int64) error {
	if err := c.flush(); err != nil {
		return err
	}
	if blockSize != c.r.size {
		return fmt.Errorf("split guest ram: the stream's block %s has %d bytes, the base %d", Block, blockSize, c.r.size)
	}
	if n := c.seenPages(); n != c.r.size/PageSize {
		return fmt.Errorf("split guest ram: the stream carried %d of its %d pages", n, c.r.size/PageSize)
	}
	c.dirty = c.changed()
	return nil
}

// page keeps p if it differs from the base. A page sent twice counts as
// its last copy.
func (c *Capture) page(p devstate.Page) error {
	if p.Off < 0 || p.Off%PageSize != 0 || p.Off+PageSize > c.r.size {
		return fmt.Errorf("page at %d: outside the %d-byte ram", p.Off, c.r.size)
	}
	content := p.Data
	if content == nil {
		if c.fill[0] != p.Fill {
			for i := range c.fill {
				c.fill[i] = p.Fill
			}
		}
		content = c.fill[:]
	}
	i := p.Off / PageSize
	c.seen[i/64] |= 1 << (i % 64)
	base := c.r.basePage(p.Off)
	if base == nil {
		base = zeroPage[:]
	}
	if bytes.Equal(content, base) {
		delete(c.own, p.Off)
		return nil
	}
	if err := c.keep(p.Off, content); err != nil {
		return err
	}
	if _, ok := c.parent[p.Off]; ok {
		c.own[p.Off] = c.r.sum(content)
	} else {
		c.own[p.Off] = pageSum{}
		c.unsummed = append(c.unsummed, p.Off)
	}
	return nil
}

func (c *Capture) seenPages() int64 {
	var n int
	for _, w := range c.seen {
		n += bits.OnesCount64(w)
	}
	return int64(n)
}

// changed are the indexes of the pages that differ from the parent, in
// order: those the
// capture or the parent holds apart from the base, unless both hold the
// same.
func (c *Capture) changed() []int64 {
	var out []int64
	for off, s := range c.own {
		if ps, ok := c.parent[off]; !ok || ps != s {
			out = append(out, off/PageSize)
		}
	}
	for off := range c.parent {
		if _, ok := c.own[off]; !ok {
			out = append(out, off/PageSize) // back to the base's content
		}
	}
	slices.Sort(out)
	return out
}

// Size is the RAM's size.
func (c *Capture) Size() int64 { return c.r.size }

// Pages are the indexes of the pages that differ from the parent
// (snapshot.PageReader).
func (c *Capture) Pages() []int64 { return c.dirty }

// Stats are the split's: the stream's bytes in and out.
func (c *Capture) Stats() devstate.Stats { return c.stats }

// OwnPages is how many pages differ from the base.
func (c *Capture) OwnPages() int { return len(c.own) }

// ReadAt reads the RAM as it was at the pause: a kept page from the pages
// file, any other from the base. Safe for concurrent use.
func (c *Capture) ReadAt(b []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("shared ram: read at %d", off)
	}
	n := 0
	for n < len(b) && off < c.r.size {
		page := off &^ (PageSize - 1)
		k := min(int64(len(b)-n), page+PageSize-off)
		dst := b[n : n+int(k)]
		if _, ok := c.own[page]; ok {
			if _, err := c.pages.ReadAt(dst, off); err != nil {
				return n, fmt.Errorf("shared ram: read kept page at %d: %w", page, err)
			}
		} else if base := c.r.basePage(page); base != nil {
			copy(dst, base[off-page:])
		} else {
			clear(dst)
		}
		n += int(k)
		off += k
	}
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

// sumRest sums the kept pages the pause did not (unsummed), from the
// pages file: the next checkpoint compares with them. A page that cannot
// be read keeps no sum, so the next checkpoint writes it again.
func (c *Capture) sumRest() error {
	buf := make([]byte, PageSize)
	var errs []error
	for _, off := range c.unsummed {
		if _, ok := c.own[off]; !ok {
			continue // sent again, with the base's content
		}
		if _, err := c.pages.ReadAt(buf, off); err != nil {
			delete(c.own, off)
			errs = append(errs, err)
			continue
		}
		c.own[off] = c.r.sum(buf)
	}
	c.unsummed = nil
	if len(errs) > 0 {
		return fmt.Errorf("sum %d kept pages: %w", len(errs), errs[0])
	}
	return nil
}

// Close drops the kept pages.
func (c *Capture) Close() error { return c.pages.Close() }
