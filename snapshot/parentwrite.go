package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/stores"
)

// PageReader is a file's new content and the pages (PageSize units)
// written since the snapshot it was restored from: a sealed
// pagefs.Generation of a lazily served guest RAM.
type PageReader interface {
	io.ReaderAt
	Size() int64
	Pages() []int64
}

// Parent is the stored file an incremental file was restored from: the
// chunks of that snapshot's file, its chunk size, the ID of the key its
// chunks are sealed with ("" for plaintext) and its lineage ("" before
// format version 3). Both come from the parent's metadata: the key a
// write uses may have been rotated since, and a parent sealed with
// another key or lineage does not fit the write (its chunks are read and
// stored anew).
type Parent struct {
	ChunkSize int64
	KeyID     string
	Lineage   string
	Chunks    []ChunkDesc
}

// ParentOf returns the file name of s as the parent of an incremental
// file.
func ParentOf(s *Snapshot, name string) *Parent {
	p := &Parent{ChunkSize: s.Metadata.ChunkSize, Chunks: s.FileChunks(name)}
	if e := s.Metadata.Encryption; e != nil {
		p.KeyID, p.Lineage = e.KeyID, e.Lineage
	}
	return p
}

// IncrementalSourceFile returns the file name whose content r reads. A
// chunk in which r wrote no page is parent's chunk there: its layer (and
// a delta's base) is reused without a read nor an upload when the store
// has it, else it is read and stored full (WriteStats.ParentMissing). A
// chunk with written pages is read from r and stored as a delta against
// parent's full chunk there (the base of parent's delta when that is a
// delta: never a delta of a delta) when that pays, else full. The dirty
// set must hold every page that differs from parent; a page in it that
// does not only costs a read.
func IncrementalSourceFile(name string, r PageReader, parent *Parent) SourceFile {
	return SourceFile{Name: name, Size: r.Size(), ReaderAt: r, parent: parent, dirty: r.Pages()}
}

// parentPlaces checks that f's parent fits the write and returns its
// chunks by offset; nil when it does not fit (every chunk is then read
// and stored full, and the reason logged).
func (w *writer) parentPlaces(ctx context.Context, f SourceFile) map[int64]*ChunkDesc {
	p := f.parent
	why := ""
	switch {
	case p.ChunkSize != w.opts.ChunkSize:
		why = fmt.Sprintf("chunk size %d, the write uses %d", p.ChunkSize, w.opts.ChunkSize)
	case p.KeyID != w.keyID():
		why = fmt.Sprintf("encryption key %q, the write uses %q", p.KeyID, w.keyID())
	case p.Lineage != w.lineage:
		why = fmt.Sprintf("lineage %q, the write seals lineage %q", p.Lineage, w.lineage)
	}
	places := make(map[int64]*ChunkDesc, len(p.Chunks))
	for k := range p.Chunks {
		if why != "" {
			break
		}
		c := &p.Chunks[k]
		if err := w.checkParentChunk(f, c); err != nil {
			why = err.Error()
		} else if places[c.Offset] != nil {
			why = fmt.Sprintf("two chunks at offset %d", c.Offset)
		}
		places[c.Offset] = c
	}
	if why != "" {
		log.G(ctx).WithFields(log.Fields{"file": f.Name, "reason": why}).Warn("parent does not fit the snapshot, writing full chunks")
		return nil
	}
	return places
}

// checkParentChunk validates what Write reuses of a parent chunk: it is a
// chunk of the file's geometry in this write's media types, a delta with
// a full base of its raw size.
func (w *writer) checkParentChunk(f SourceFile, c *ChunkDesc) error {
	cs := w.opts.ChunkSize
	if c.Offset < 0 || c.Offset%cs != 0 || c.Offset >= f.Size || c.Size != min(cs, f.Size-c.Offset) {
		return fmt.Errorf("chunk at %d of %d bytes does not fit a %d-byte file in %d-byte chunks", c.Offset, c.Size, f.Size, cs)
	}
	check := func(d ocispec.Descriptor, mediaType string) error {
		if d.MediaType != mediaType {
			return fmt.Errorf("chunk at %d: media type %q, want %q", c.Offset, d.MediaType, mediaType)
		}
		if err := stores.CheckDigest(d.Digest); err != nil {
			return fmt.Errorf("chunk at %d: %w", c.Offset, err)
		}
		if d.Size <= 0 || d.Size > maxStoredSize(cs) {
			return fmt.Errorf("chunk at %d: stored size %d outside [1, %d]", c.Offset, d.Size, maxStoredSize(cs))
		}
		return nil
	}
	if c.Base == nil {
		return check(c.Stored, w.codec.mediaType())
	}
	if err := check(c.Stored, w.codec.deltaMediaType()); err != nil {
		return err
	}
	if b := c.Stored.Annotations[AnnotationBase]; b != c.Base.Digest.String() {
		return fmt.Errorf("chunk at %d: delta against %q, its base is %s", c.Offset, b, c.Base.Digest)
	}
	return check(*c.Base, w.codec.mediaType())
}

// readIncremental feeds the chunks of f (which has a parent) to jobs: see
// IncrementalSourceFile.
func (w *writer) readIncremental(ctx context.Context, fileIdx int, f SourceFile, jobs chan<- *chunkJob) error {
	cs := w.opts.ChunkSize
	n := (f.Size + cs - 1) / cs
	dirty := make([]bool, n)
	for _, pg := range f.dirty {
		if pg < 0 || pg*PageSize >= f.Size {
			return fmt.Errorf("%s: dirty page %d outside the file's %d bytes: %w", f.Name, pg, f.Size, errdefs.ErrInvalidArgument)
		}
		dirty[pg*PageSize/cs] = true
		w.dirtyBytes.Add(min(PageSize, f.Size-pg*PageSize))
	}
	places := w.parentPlaces(ctx, f)
	for idx := int64(0); idx < n; idx++ {
		pc := places[idx*cs]
		switch {
		case places == nil:
			// No usable parent: the whole content is read.
		case dirty[idx]:
		case pc == nil:
			continue // a hole or zeros in the parent, not written since
		case w.reuse(ctx, fileIdx, f.Name, pc):
			continue
		default:
			w.parentMissing.Add(1)
			pc = nil
		}
		if !dirty[idx] {
			pc = nil
		}
		stored, err := w.readChunk(ctx, fileIdx, f, idx, pc, jobs)
		if err != nil {
			return err
		}
		if stored && places == nil {
			w.parentMissing.Add(1)
		}
	}
	return nil
}

// reuse places parent chunk pc in the new snapshot when the store has its
// blobs, and reports whether it did.
func (w *writer) reuse(ctx context.Context, fileIdx int, file string, pc *ChunkDesc) bool {
	if !w.baseExists(ctx, pc.Stored) || (pc.Base != nil && !w.baseExists(ctx, *pc.Base)) {
		return false
	}
	desc := placedDesc(pc.Stored, file, pc.Offset, pc.Size)
	j := chunkJob{fileIdx: fileIdx, off: pc.Offset, desc: desc}
	if pc.Base != nil {
		desc.Annotations[AnnotationBase] = pc.Base.Digest.String()
		j.base = fullEntry(*pc.Base, pc.Size)
		w.deltas.Add(1)
	}
	w.mu.Lock()
	w.claimed[desc.Digest.String()] = true
	w.layers = append(w.layers, j)
	w.perFile[fileIdx]++
	if j.base != nil {
		w.addBase(j.base)
	}
	w.mu.Unlock()
	w.reused.Add(1)
	w.dataBytes.Add(pc.Size)
	w.storedBytes.Add(desc.Size)
	w.skippedBytes.Add(desc.Size)
	w.skippedN.Add(1)
	return true
}

// placedDesc is d (media type, digest, size) placed at off of file: a
// chunk layer of every kind (full, delta, reused) is annotated so.
func placedDesc(d ocispec.Descriptor, file string, off, size int64) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size, Annotations: map[string]string{
		AnnotationFile:   file,
		AnnotationOffset: strconv.FormatInt(off, 10),
		AnnotationSize:   strconv.FormatInt(size, 10),
	}}
}

// fullEntry is the base entry of the full chunk d of size raw bytes.
func fullEntry(d ocispec.Descriptor, size int64) *pageEntry {
	return &pageEntry{base: ocispec.Descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size}, size: size}
}

// parentScratch is a compress worker's buffers for deltas against parent
// chunks.
type parentScratch struct {
	stored, open, base []byte
	changed            []int
	payload            []byte
}

func newParentScratch(cs int64) *parentScratch {
	return &parentScratch{stored: make([]byte, maxStoredSize(cs)+1), open: make([]byte, maxStoredSize(cs)),
		base: make([]byte, cs), changed: make([]int, 0, cs/PageSize), payload: make([]byte, 0, cs)}
}

// fromParent stores the written chunk j as its parent's full chunk (no
// page differs) or as a delta against it (few differ), and reports
// whether it did; else the caller stores j full. The parent's full chunk
// is fetched from the target store and compared page by page, so the
// delta holds exactly the pages that differ from it.
func (w *writer) fromParent(ctx context.Context, j *chunkJob, ps *parentScratch, scratch []byte) bool {
	raw := *j.raw
	size := int64(len(raw))
	base := j.parent.Stored
	if j.parent.Base != nil {
		base = *j.parent.Base
	}
	if !w.baseExists(ctx, base) {
		w.parentMissing.Add(1)
		return false
	}
	from := w.store
	if w.opts.ParentReads != nil {
		from = w.opts.ParentReads
	}
	sb, err := fetchVerified(ctx, from, base, maxStoredSize(w.opts.ChunkSize), 0, ps.stored)
	var b []byte
	if err == nil {
		b, err = w.dcodec.open(j.file, j.off, size, sb, ps.open, ps.base)
	}
	if err != nil {
		log.G(ctx).WithError(err).WithFields(log.Fields{"file": j.file, "offset": j.off, "base": base.Digest}).Warn("parent chunk unreadable, storing the chunk full")
		w.parentMissing.Add(1)
		return false
	}
	ps.changed = ps.changed[:0]
	for i := 0; int64(i)*PageSize < size; i++ {
		s, e := pageSpan(i, size)
		if !bytes.Equal(raw[s:e], b[s:e]) {
			ps.changed = append(ps.changed, i)
		}
	}
	if len(ps.changed) > 0 && deltaPayloadSize(size, ps.changed)*maxDeltaShare > size {
		return false
	}
	j.desc = placedDesc(base, j.file, j.off, size)
	if len(ps.changed) == 0 {
		return true // the base's blob is this chunk, known to be there
	}
	ps.payload = appendDeltaPayload(ps.payload[:0], raw, ps.changed)
	j.stored = w.storedPool.get()
	out := w.codec.sealDelta(j.file, j.off, size, base.Digest, ps.payload, scratch, *j.stored)
	*j.stored = out
	j.desc.MediaType, j.desc.Digest, j.desc.Size = w.codec.deltaMediaType(), sha256Digest(out), int64(len(out))
	j.desc.Annotations[AnnotationBase] = base.Digest.String()
	j.base = fullEntry(base, size)
	w.deltas.Add(1)
	return true
}
