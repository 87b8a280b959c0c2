// Package pagefs serves guest RAM files to QEMU through FUSE, page by page,
// from a Source that fetches and verifies its bytes on first use.
//
// A File is either read-only (one per snapshot: every restore maps it
// share=off and the kernel keeps one page-cache copy for all of them) or
// layered (one per sandbox: QEMU maps it share=on; reads come from the base
// until a page is written, writes land in a sparse layer file and mark the
// page dirty, so a checkpoint knows exactly which pages changed).
package pagefs

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
)

// PageSize is the unit of the dirty set.
const PageSize = 4096

// Source is the content of a served file before any write. ReadAt must
// return only verified bytes, or an error: pagefs hands what it returns to
// QEMU as guest RAM.
type Source interface {
	io.ReaderAt
	Size() int64
}

// Stats counts what the kernel asked of a File.
type Stats struct {
	Reads, ReadBytes   int64 // READ requests and their bytes
	MaxRead            int64 // the largest READ
	Writes, WriteBytes int64 // WRITE requests (writeback) and their bytes
	ReadErrors         int64
}

// File is one served file.
type File struct {
	name  string
	base  Source
	size  int64
	layer *os.File // nil: read-only

	mu      sync.RWMutex // guards the bitmaps and gen, orders layer reads after writes
	inLayer bitmap       // pages whose content is in layer
	dirty   bitmap       // pages written since the last Seal
	// spare is a cleared bitmap for Seal to swap dirty with, so that the
	// pause allocates and clears nothing. nil while a generation is open:
	// its Close, after the guest resumed, clears the sealed one into it.
	spare bitmap
	gen   *Generation // the sealed generation still being read, if any

	dirtyCount atomic.Int64 // pages set in dirty

	reads, readBytes, maxRead, writes, writeBytes, readErrs atomic.Int64
}

// NewReadOnly serves base as name. Opens for writing succeed (QEMU 7.2
// opens a memory-backend-file read-write even for share=off) but every
// write fails with EROFS.
func NewReadOnly(name string, base Source) *File {
	return &File{name: name, base: base, size: base.Size()}
}

// NewLayered serves base as name with writes kept in layer, a file of
// base's size (sparse: only written pages take space) that the caller owns.
func NewLayered(name string, base Source, layer *os.File) (*File, error) {
	st, err := layer.Stat()
	if err != nil {
		return nil, fmt.Errorf("layer of %s: %w", name, err)
	}
	if st.Size() != base.Size() {
		return nil, fmt.Errorf("layer of %s: %d bytes, base has %d", name, st.Size(), base.Size())
	}
	pages := (base.Size() + PageSize - 1) / PageSize
	return &File{name: name, base: base, size: base.Size(), layer: layer,
		inLayer: newBitmap(pages), dirty: newBitmap(pages), spare: newBitmap(pages)}, nil
}

// Name is the file's name in the mount.
func (f *File) Name() string { return f.name }

// Size is the file's size.
func (f *File) Size() int64 { return f.size }

// Stats returns the counters so far.
func (f *File) Stats() Stats {
	return Stats{
		Reads: f.reads.Load(), ReadBytes: f.readBytes.Load(), MaxRead: f.maxRead.Load(),
		Writes: f.writes.Load(), WriteBytes: f.writeBytes.Load(), ReadErrors: f.readErrs.Load(),
	}
}

// DirtyPages returns the indexes of the pages written since the file was
// made or last sealed, in order. Call it after the writer stopped and its
// dirty page cache was written back (Sync on the mounted file), or pages
// still in the kernel are missing.
func (f *File) DirtyPages() []int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.dirty.list(f.dirtyCount.Load())
}

// DirtyCount is the number of pages written since the file was made or
// last sealed, kept as they are written: a caller can watch it while the
// guest runs without listing the dirty set.
func (f *File) DirtyCount() int64 { return f.dirtyCount.Load() }

// ReadAt reads the file as QEMU sees it: written pages from the layer, the
// others from the base.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= f.size {
		return 0, io.EOF
	}
	if int64(len(p)) > f.size-off {
		p = p[:f.size-off]
	}
	n, err := f.readAt(p, off)
	f.reads.Add(1)
	f.readBytes.Add(int64(n))
	for m := f.maxRead.Load(); int64(len(p)) > m && !f.maxRead.CompareAndSwap(m, int64(len(p))); m = f.maxRead.Load() {
	}
	if err != nil {
		f.readErrs.Add(1)
	}
	return n, err
}

func (f *File) readAt(p []byte, off int64) (int, error) {
	if f.layer == nil {
		return readFull(f.base, p, off)
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.view(p, off)
}

// view reads the current content: pages in the layer from there, the
// others from the base. The caller holds f.mu.
func (f *File) view(p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		fromLayer := f.inLayer.has(pos / PageSize)
		end := pos/PageSize*PageSize + PageSize
		for end < off+int64(len(p)) && f.inLayer.has(end/PageSize) == fromLayer {
			end += PageSize
		}
		end = min(end, off+int64(len(p)))
		src := f.base
		if fromLayer {
			src = layerSource{f.layer}
		}
		n, err := readFull(src, p[done:done+int(end-pos)], pos)
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// WriteAt writes into the layer. A page only partly covered is first
// copied from the base, so the layer always holds whole pages.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	if f.layer == nil {
		return 0, errReadOnly
	}
	if off < 0 || off+int64(len(p)) > f.size {
		return 0, errOutOfRange
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	first, last := off/PageSize, (off+int64(len(p))-1)/PageSize
	if f.gen != nil {
		for pg := first; pg <= last; pg++ {
			if err := f.preserve(pg); err != nil {
				return 0, err
			}
		}
	}
	for _, pg := range []int64{first, last} {
		if err := f.fillPartial(pg, off, int64(len(p))); err != nil {
			return 0, err
		}
	}
	n, err := f.layer.WriteAt(p, off)
	for pg := first; pg <= last; pg++ {
		f.inLayer.set(pg)
		if !f.dirty.has(pg) {
			f.dirty.set(pg)
			f.dirtyCount.Add(1)
		}
	}
	f.writes.Add(1)
	f.writeBytes.Add(int64(n))
	return n, err
}

// fillPartial copies page pg from the base into the layer if the write
// [off, off+n) covers it only in part and it is not in the layer yet.
func (f *File) fillPartial(pg, off, n int64) error {
	start := pg * PageSize
	end := min(start+PageSize, f.size)
	if f.inLayer.has(pg) || (off <= start && off+n >= end) {
		return nil
	}
	buf := make([]byte, end-start)
	if _, err := readFull(f.base, buf, start); err != nil {
		return err
	}
	_, err := f.layer.WriteAt(buf, start)
	return err
}

// bitmap has one bit per page.
type bitmap []uint64

func newBitmap(pages int64) bitmap { return make(bitmap, (pages+63)/64) }

func (b bitmap) has(pg int64) bool { return b[pg/64]&(1<<(pg%64)) != 0 }
func (b bitmap) set(pg int64)      { b[pg/64] |= 1 << (pg % 64) }

// list returns the set pages in order; n (how many are set) sizes the
// result.
func (b bitmap) list(n int64) []int64 {
	out := make([]int64, 0, n)
	for i, w := range b {
		for w != 0 {
			bit := bits.TrailingZeros64(w)
			out = append(out, int64(i)*64+int64(bit))
			w &^= 1 << bit
		}
	}
	return out
}

var (
	errReadOnly   = errors.New("read-only file")
	errOutOfRange = errors.New("write beyond the end of the file")
)

type layerSource struct{ *os.File }

func (l layerSource) Size() int64 { return 0 }

func readFull(r io.ReaderAt, p []byte, off int64) (int, error) {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return n, nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
