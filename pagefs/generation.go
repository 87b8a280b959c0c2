package pagefs

import (
	"errors"
	"fmt"
	"os"
)

// A Generation is a layered file's content frozen by Seal while the guest
// runs on: a checkpoint pauses the guest, writes its dirty page cache back,
// seals, resumes, and reads the generation afterwards, outside the pause.
// Until Close, the first write to a page after the seal first copies the
// page's sealed content to a side file (copy-before-write), so the
// generation reads the same bytes however the guest writes meanwhile.
type Generation struct {
	f     *File
	pages []int64 // written between the previous seal and this one
	side  *os.File
	saved bitmap // pages whose sealed content is in side
}

// Seal freezes the file's content and starts a new dirty set. side is an
// empty file for the pages written while the generation is open (sparse:
// it grows only by those). One generation is open at a time.
func (f *File) Seal(side *os.File) (*Generation, error) {
	if f.layer == nil {
		return nil, errReadOnly
	}
	if err := side.Truncate(f.size); err != nil {
		return nil, fmt.Errorf("seal %s: %w", f.name, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != nil {
		return nil, errors.New("seal " + f.name + ": a sealed generation is still open")
	}
	g := &Generation{f: f, pages: f.dirty.list(), side: side, saved: newBitmap(int64(len(f.inLayer)) * 64)}
	f.dirty = newBitmap(int64(len(f.dirty)) * 64)
	f.gen = g
	return g, nil
}

// Pages returns the pages written in this generation (its dirty set).
func (g *Generation) Pages() []int64 { return g.pages }

// Size is the file's size.
func (g *Generation) Size() int64 { return g.f.size }

// ReadAt reads the content as it was at Seal.
func (g *Generation) ReadAt(p []byte, off int64) (int, error) {
	f := g.f
	if off < 0 || off+int64(len(p)) > f.size {
		return 0, errOutOfRange
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		end := min(pos/PageSize*PageSize+PageSize, off+int64(len(p)))
		var err error
		if g.saved.has(pos / PageSize) {
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

// Close ends the generation: later writes no longer copy. The caller
// removes side.
func (g *Generation) Close() {
	g.f.mu.Lock()
	defer g.f.mu.Unlock()
	if g.f.gen == g {
		g.f.gen = nil
	}
}

// preserve copies page pg's sealed content to side before its first write
// after the seal. The caller holds f.mu for writing.
func (g *Generation) preserve(pg int64) error {
	if g.saved.has(pg) {
		return nil
	}
	start := pg * PageSize
	buf := make([]byte, min(PageSize, g.f.size-start))
	if _, err := g.f.view(buf, start); err != nil {
		return err
	}
	if _, err := g.side.WriteAt(buf, start); err != nil {
		return err
	}
	g.saved.set(pg)
	return nil
}
