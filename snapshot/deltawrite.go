package snapshot

import (
	"context"
	"sort"
	"strconv"

	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// maxDeltaShare: a chunk becomes a delta only when its delta payload is at
// most this share of the chunk; past it, the chunk is stored full and
// becomes the new base (a delta costs its base's fetch on restore too).
const maxDeltaShare = 2

// deltaScratch is a compress worker's buffers for page hashing and deltas.
type deltaScratch struct {
	hashes  []byte
	changed []int
	payload []byte
}

func newDeltaScratch(chunkSize int64) *deltaScratch {
	pages, _ := deltaGeometry(chunkSize)
	return &deltaScratch{hashes: make([]byte, 0, pages*pageHashSize), changed: make([]int, 0, pages),
		payload: make([]byte, 0, chunkSize)}
}

func newPageEntry(desc ocispec.Descriptor, size int64, hashes []byte) *pageEntry {
	return &pageEntry{base: ocispec.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size},
		size: size, pages: append([]byte(nil), hashes...)}
}

// useBase adopts opts.Base when it fits this write.
func (w *writer) useBase(ctx context.Context) {
	w.hashPages = w.opts.IndexPath != ""
	b := w.opts.Base
	if b == nil {
		return
	}
	if why := b.mismatch(w.opts.ChunkSize, w.keyID(), w.lineage, w.opts.StoreID); why != "" {
		log.G(ctx).WithFields(log.Fields{"index": b.manifest, "reason": why}).Info("page index does not fit, writing full chunks")
		return
	}
	w.base, w.hashPages = b, true
}

func (w *writer) keyID() string {
	if w.opts.EncryptionKey == nil {
		return ""
	}
	return KeyID(w.opts.EncryptionKey)
}

// incremental hashes j's pages and, when the page index has a base for its
// place that is still in the store, stores j as that base's blob
// (unchanged) or as a delta against it (few pages changed); it reports
// whether it did. Otherwise ds.hashes are j's page hashes, for the entry
// of the full chunk the caller stores.
func (w *writer) incremental(ctx context.Context, j *chunkJob, ds *deltaScratch, scratch []byte) bool {
	raw := *j.raw
	size := int64(len(raw))
	ds.hashes = pageHashes(ds.hashes, raw)
	if w.base == nil {
		return false
	}
	e := w.base.entries[pagePlace{j.file, j.off}]
	if e == nil || e.size != size {
		return false
	}
	ds.changed = changedPages(ds.changed, e.pages, ds.hashes)
	if len(ds.changed) > 0 && deltaPayloadSize(size, ds.changed)*maxDeltaShare > size {
		return false
	}
	if !w.baseExists(ctx, e.base) {
		return false
	}
	j.entry = e
	if len(ds.changed) == 0 {
		// The base's blob is this chunk: nothing to compress or push.
		j.desc = placedDesc(e.base, j.file, j.off, size)
		return true
	}
	ds.payload = appendDeltaPayload(ds.payload[:0], raw, ds.changed)
	j.stored = w.storedPool.get()
	out := w.codec.sealDelta(j.file, j.off, size, e.base.Digest, ds.payload, scratch, *j.stored)
	*j.stored = out
	j.desc = placedDesc(ocispec.Descriptor{MediaType: w.codec.deltaMediaType(), Digest: sha256Digest(out), Size: int64(len(out))}, j.file, j.off, size)
	j.desc.Annotations[AnnotationBase] = e.base.Digest.String()
	j.base = e
	w.deltas.Add(1)
	return true
}

// baseExists asks the store, once per digest, whether a base is there. An
// error counts as absent: the chunk is then stored full.
func (w *writer) baseExists(ctx context.Context, d ocispec.Descriptor) bool {
	k := d.Digest.String()
	w.mu.Lock()
	ok, known := w.existing[k]
	w.mu.Unlock()
	if known {
		return ok
	}
	ok, err := w.store.Exists(ctx, d)
	if err != nil {
		log.G(ctx).WithError(err).WithField("digest", d.Digest).Debug("base chunk: exists")
		ok = false
	}
	w.mu.Lock()
	w.existing[k] = ok
	w.mu.Unlock()
	return ok
}

// addBase lists e's base as a base layer (once). Called with w.mu held.
func (w *writer) addBase(e *pageEntry) {
	k := e.base.Digest.String()
	if _, ok := w.bases[k]; ok {
		return
	}
	w.bases[k] = ocispec.Descriptor{MediaType: e.base.MediaType, Digest: e.base.Digest, Size: e.base.Size,
		Annotations: map[string]string{AnnotationRole: RoleBase, AnnotationSize: strconv.FormatInt(e.size, 10)}}
	w.storedBytes.Add(e.base.Size)
	w.skippedBytes.Add(e.base.Size)
}

// baseLayers returns the base layers in digest order: they follow the
// placed layers in the manifest.
func (w *writer) baseLayers() []ocispec.Descriptor {
	out := make([]ocispec.Descriptor, 0, len(w.bases))
	for _, d := range w.bases {
		out = append(out, d)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Digest < out[b].Digest })
	return out
}

// saveIndex saves the page index of the snapshot just published, when
// asked to.
func (w *writer) saveIndex(ctx context.Context, desc ocispec.Descriptor) {
	if w.opts.IndexPath == "" {
		return
	}
	x := &PageIndex{chunkSize: w.opts.ChunkSize, keyID: w.keyID(), lineage: w.lineage, store: w.opts.StoreID, manifest: desc.Digest,
		entries: make(map[pagePlace]*pageEntry, len(w.layers))}
	for _, l := range w.layers {
		if l.entry != nil {
			x.entries[pagePlace{w.src.Files[l.fileIdx].Name, l.off}] = l.entry
		}
	}
	if err := x.save(w.opts.IndexPath); err != nil {
		log.G(ctx).WithError(err).Warn("snapshot published, its page index not saved: the next one may upload more")
	}
}
