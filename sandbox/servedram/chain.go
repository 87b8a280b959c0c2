package servedram

import (
	"context"

	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/pagefs"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// WriteParent is the served RAM's parent as the snapshot writer takes it
// for a write with wopts (its chunk size decided: ChunkSize). Its key ID
// and lineage are the parent's metadata's, not the key the checkpoint
// writes with: a namespace key rotated while the sandbox runs makes the
// parent not fit (the writer then stores full chunks under the new key)
// instead of placing chunks sealed with the old key in a snapshot that
// names the new one.
func (r *RAM) WriteParent(wopts snapshot.WriteOptions) *snapshot.Parent {
	p := r.Parent()
	if p.Zero {
		return zeroParent(wopts)
	}
	return p.ForWrite()
}

// ForWrite is p as the parent of a checkpoint's write.
func (p Parent) ForWrite() *snapshot.Parent {
	return &snapshot.Parent{ChunkSize: p.ChunkSize, Chunks: p.Chunks, KeyID: p.KeyID, Lineage: p.Lineage}
}

// zeroParent is a booted RAM's parent at its first checkpoint: all zeros,
// no chunk, so that only the chunks with pages the guest wrote are read
// and stored (full), the others are holes. It must fit the write, so it
// takes the write's key ID and lineage; an encrypted write whose lineage
// is chosen as it runs (WriteOptions.Lineage empty) gets no parent: the
// RAM is then read whole and its zero chunks skipped, which is slower,
// not wrong.
func zeroParent(wopts snapshot.WriteOptions) *snapshot.Parent {
	p := &snapshot.Parent{ChunkSize: wopts.ChunkSize}
	if wopts.EncryptionKey != nil {
		if wopts.Lineage == "" {
			return nil
		}
		p.KeyID, p.Lineage = snapshot.KeyID(wopts.EncryptionKey), wopts.Lineage
	}
	return p
}

// sealOf is the key ID and lineage of a snapshot's chunks ("" for
// plaintext).
func sealOf(md *snapshot.Metadata) (keyID, lineage string) {
	if e := md.Encryption; e != nil {
		return e.KeyID, e.Lineage
	}
	return "", ""
}

// ChunkSize is the chunk size of a served RAM's checkpoint: its parent's,
// so that a chain keeps reusing its chunks whatever the node's
// [snapshot] chunk_size says (configured is WriteOptions.ChunkSize).
func (r *RAM) ChunkSize(ctx context.Context, configured int64) int64 {
	return r.Parent().WriteChunkSize(ctx, configured)
}

// WriteChunkSize is the chunk size of a checkpoint written against p:
// p's, unless p has none usable (configured, or the default if 0).
func (p Parent) WriteChunkSize(ctx context.Context, configured int64) int64 {
	cs := p.ChunkSize
	if configured == 0 {
		configured = snapshot.DefaultChunkSize
	}
	if cs < snapshot.MinChunkSize || cs > snapshot.MaxChunkSize || cs&(cs-1) != 0 {
		return configured // no usable parent: the checkpoint writes the whole RAM
	}
	if cs != configured {
		log.G(ctx).WithFields(log.Fields{"parent": cs, "configured": configured}).Info("checkpoint of ram: the parent's chunk size")
	}
	return cs
}

// Published makes the snapshot just written the parent of the next
// checkpoint and closes its generation g: g's pages are in it, the file's
// dirty set now holds only what the guest wrote since the seal.
func (r *RAM) Published(ctx context.Context, g *pagefs.Generation, store stores.Store, to string, desc ocispec.Descriptor, st snapshot.WriteStats) {
	r.endGeneration(g, true)
	l := log.G(ctx).WithFields(log.Fields{"reused_chunks": st.Reused, "delta_chunks": st.Deltas,
		"uploaded_bytes": st.UploadedBytes, "dirty_bytes": st.DirtyBytes})
	if st.ParentMissing > 0 {
		l.WithField("full_chunks", st.ParentMissing).Warn("checkpoint of served ram: parent's blobs missing: full chunks")
	}
	r.setParent(ReadParent(ctx, store, to, desc))
	l.Info("checkpoint of served ram published")
}

// ReadParent reads back the snapshot desc just written to store (whose
// URL is to) as the parent of the next checkpoint. One that cannot be
// read is a parent without chunks: the next checkpoint writes the whole
// RAM.
func ReadParent(ctx context.Context, store stores.Store, to string, desc ocispec.Descriptor) Parent {
	s, err := snapshot.Open(ctx, store, desc.Digest.String(), snapshot.ReadOptions{})
	if err != nil {
		log.G(ctx).WithError(err).Warn("checkpoint of ram: the new snapshot cannot be read back, the next checkpoint writes the whole ram")
		return Parent{StoreURL: to, Manifest: desc.Digest}
	}
	return ParentOf(to, s)
}

// ParentOf is snapshot s of storeURL as a parent: its RAM file's chunks.
func ParentOf(storeURL string, s *snapshot.Snapshot) Parent {
	p := Parent{StoreURL: storeURL, Manifest: s.Descriptor.Digest, ChunkSize: s.Metadata.ChunkSize, Chunks: s.FileChunks(snapshot.FileRAM)}
	p.KeyID, p.Lineage = sealOf(&s.Metadata)
	return p
}

// LostGeneration ends a checkpoint that failed after PreSync: the side
// file it readied is dropped and its generation g, if it sealed one, is
// abandoned. g's pages are in no snapshot, so they join the dirty set
// again: the parent stays the last snapshot published, and the next
// checkpoint writes what the guest changed since it (g's pages and those
// written since the seal), not the whole RAM.
func (r *RAM) LostGeneration(ctx context.Context, g *pagefs.Generation) {
	if g != nil {
		r.endGeneration(g, false)
		log.G(ctx).WithField("parent", r.Parent().Manifest).Warn("checkpoint of served ram failed after the seal: the next one writes what changed since the parent")
	}
	r.mu.Lock()
	next := r.next
	r.next = nil
	r.mu.Unlock()
	if next != nil {
		next.Close()
	}
}

// setParent replaces the parent a checkpoint reads (checkpoints of one
// sandbox do not overlap).
func (r *RAM) setParent(p Parent) {
	r.mu.Lock()
	r.parent = p
	r.mu.Unlock()
}

// WorkingSet is the RAM chunks the guest faulted since its restore, in the
// order of its first faults, as chunk indexes at chunk size cs: the next
// lazy restore of the checkpoint prefetches them first.
func (r *RAM) WorkingSet(cs int64) []int64 {
	if len(r.readers) == 0 || cs <= 0 {
		return nil
	}
	fr := r.readers[0] // ram
	from := fr.ChunkSize()
	n := (fr.Size() + cs - 1) / cs
	var out []int64
	seen := map[int64]bool{}
	for _, idx := range fr.Order() {
		for off := idx * from; off < (idx+1)*from && off < fr.Size(); off += cs {
			if i := off / cs; !seen[i] && i < n {
				seen[i] = true
				out = append(out, i)
			}
		}
	}
	return out
}
