package pagefs

import (
	"errors"
	"math/bits"
	"os"
	"sync"
)

// A Generation is a layered file's content frozen by Seal while the guest
// runs on: a checkpoint pauses the guest, writes its dirty page cache back,
// seals, resumes, and reads the generation afterwards, outside the pause.
// Until Close, the first write to a page after the seal first copies the
// page's sealed content to a side file (copy-before-write), so the
// generation reads the same bytes however the guest writes meanwhile.
//
// Seal costs the same whatever the file's size: it swaps the dirty set for
// an empty one and lists nothing. The file's dirty set since the seal is
// also the record of which pages side holds (a page is copied exactly at
// its first write after the seal), so no other bitmap is made.
type Generation struct {
	f    *File
	side *os.File
	n    int64 // pages in sealed

	// sealed is the dirty set at Seal: listed by the first Pages, after the
	// guest resumed, then cleared by Close for the next Seal to swap in.
	sealed bitmap
	listed sync.Once
	pages  []int64
	closed sync.Once
}

// Seal freezes the file's content and starts a new dirty set. side is an
// empty file for the pages written while the generation is open (sparse:
// it grows only by those). One generation is open at a time.
func (f *File) Seal(side *os.File) (*Generation, error) {
	if f.layer == nil {
		return nil, errReadOnly
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != nil {
		return nil, errors.New("seal " + f.name + ": a sealed generation is still open")
	}
	g := &Generation{f: f, side: side, sealed: f.dirty, n: f.dirtyCount.Load()}
	f.dirty, f.spare = f.spare, nil
	f.dirtyCount.Store(0)
	f.gen = g
	return g, nil
}

// Pages returns the pages written in this generation (its dirty set), in
// order. The first call lists them: call it after the guest resumed.
func (g *Generation) Pages() []int64 {
	g.listed.Do(func() { g.pages = g.sealed.list(g.n) })
	return g.pages
}

// Size is the file's size.
func (g *Generation) Size() int64 { return g.f.size }

// ReadAt reads the content as it was at Seal, until Close.
func (g *Generation) ReadAt(p []byte, off int64) (int, error) {
	f := g.f
	if off < 0 || off+int64(len(p)) > f.size {
		return 0, errOutOfRange
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.gen != g {
		return 0, errClosed
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		saved := f.dirty.has(pos / PageSize)
		end := pos/PageSize*PageSize + PageSize
		for end < off+int64(len(p)) && f.dirty.has(end/PageSize) == saved {
			end += PageSize
		}
		end = min(end, off+int64(len(p)))
		var err error
		if saved {
			_, err = readFull(layerSource{g.side}, p[done:done+int(end-pos)], pos)
		} else {
			_, err = f.view(p[done:done+int(end-pos)], pos)
		}
		if err != nil {
			return done, err
		}
		done += int(end - pos)
	}
	return done, nil
}

// Close ends the generation: later writes no longer copy, and ReadAt
// fails. Pages still answers. The caller removes side.
func (g *Generation) Close() {
	g.closed.Do(func() {
		g.Pages()
		// Nothing writes sealed since Seal and Pages is done with it: it is
		// cleared here, out of the lock and of the next pause.
		clear(g.sealed)
		f := g.f
		f.mu.Lock()
		if f.gen == g {
			f.gen = nil
			f.spare = g.sealed
		}
		f.mu.Unlock()
		g.sealed = nil
	})
}

// Abandon ends a generation whose checkpoint failed: its pages are in no
// snapshot, so they join the file's dirty set again (with those written
// since the seal), and the next generation holds every page written since
// the last one that was kept (Closed after its snapshot was published).
// Otherwise it is Close: later writes no longer copy, ReadAt fails, Pages
// still answers, the caller removes side. Abandon after Close, or twice,
// does nothing.
//
// It walks the file's bitmaps once, with writes held off: call it after
// the guest resumed, as Close.
func (g *Generation) Abandon() {
	g.closed.Do(func() {
		g.Pages()
		f := g.f
		f.mu.Lock()
		if f.gen == g {
			var added int64
			for i, w := range g.sealed {
				added += int64(bits.OnesCount64(w &^ f.dirty[i]))
				f.dirty[i] |= w
				g.sealed[i] = 0
			}
			f.dirtyCount.Add(added)
			f.gen = nil
			f.spare = g.sealed
		}
		f.mu.Unlock()
		g.sealed = nil
	})
}

// preserve copies page pg's sealed content to the open generation's side
// file before its first write after the seal, which is when it is not yet
// in the dirty set. The caller holds f.mu for writing.
func (f *File) preserve(pg int64) error {
	if f.dirty.has(pg) {
		return nil
	}
	start := pg * PageSize
	buf := make([]byte, min(PageSize, f.size-start))
	if _, err := f.view(buf, start); err != nil {
		return err
	}
	_, err := f.gen.side.WriteAt(buf, start)
	return err
}

var errClosed = errors.New("generation closed")
