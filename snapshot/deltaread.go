package snapshot

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/stores"
)

// deltaRef is one validated delta layer.
type deltaRef struct {
	chunkRef
	base  digest.Digest
	layer int
}

// baseRef is one validated base layer.
type baseRef struct {
	desc  ocispec.Descriptor
	size  int64
	layer int
}

// isDelta reports whether l has the delta media type this snapshot allows:
// version 2 and the encryption of the snapshot.
func (s *Snapshot) isDelta(l ocispec.Descriptor) bool {
	if s.Metadata.FormatVersion < FormatVersionDelta {
		return false
	}
	if s.Metadata.Encryption != nil {
		return l.MediaType == MediaTypeDeltaEncrypted
	}
	return l.MediaType == MediaTypeDelta
}

// linkDeltas validates the base layers (indexes into the manifest's layers)
// and ties every delta to its base: a full chunk listed once as a base
// layer of this manifest, of the delta's raw size, used by at least one
// delta; in an encrypted snapshot by exactly one (a sealed base is bound to
// its place).
func (s *Snapshot) linkDeltas(baseLayers []int) error {
	md := &s.Metadata
	cs := md.ChunkSize
	wantType := MediaTypeChunk
	if md.Encryption != nil {
		wantType = MediaTypeChunkEncrypted
	}
	s.bases = make(map[digest.Digest]baseRef, len(baseLayers))
	for _, i := range baseLayers {
		l := s.Manifest.Layers[i]
		bad := func(format string, a ...any) error {
			return fmt.Errorf("base layer %d (%s): %s: %w", i, l.Digest, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
		}
		if md.FormatVersion < FormatVersionDelta {
			return bad("a version %d snapshot has no base layers", md.FormatVersion)
		}
		if r := l.Annotations[AnnotationRole]; r != RoleBase {
			return bad("role %q, want %q", r, RoleBase)
		}
		if l.MediaType != wantType {
			return bad("media type %q, want %q (a base is a full chunk, never a delta)", l.MediaType, wantType)
		}
		if err := stores.CheckDigest(l.Digest); err != nil {
			return bad("%v", err)
		}
		if l.Size <= 0 || l.Size > maxStoredSize(cs) {
			return bad("stored size %d outside [1, %d]", l.Size, maxStoredSize(cs))
		}
		for _, k := range []string{AnnotationFile, AnnotationOffset, AnnotationBase} {
			if _, ok := l.Annotations[k]; ok {
				return bad("annotation %s: a base layer is placed by its deltas only", k)
			}
		}
		size, err := parseDec(l.Annotations[AnnotationSize])
		if err != nil || size <= 0 || size > cs {
			return bad("raw size %q outside [1, %d]", l.Annotations[AnnotationSize], cs)
		}
		if prev, ok := s.bases[l.Digest]; ok {
			return bad("listed twice as a base (also layer %d)", prev.layer)
		}
		s.bases[l.Digest] = baseRef{desc: l, size: size, layer: i}
	}
	for _, c := range s.chunks {
		if _, ok := c.desc.Annotations[AnnotationBase]; ok {
			return fmt.Errorf("layer %s: full chunk with a base annotation: %w", c.desc.Digest, errdefs.ErrInvalidArgument)
		}
	}
	deltaDigests := make(map[digest.Digest]bool, len(s.deltas))
	for _, d := range s.deltas {
		deltaDigests[d.desc.Digest] = true
	}
	users := map[digest.Digest]int{}
	for k := range s.deltas {
		d := &s.deltas[k]
		bad := func(format string, a ...any) error {
			return fmt.Errorf("delta layer %d (%s) at offset %d of %s: %s: %w", d.layer, d.desc.Digest, d.off, d.file, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
		}
		d.base = digest.Digest(d.desc.Annotations[AnnotationBase])
		if err := stores.CheckDigest(d.base); err != nil {
			return bad("base: %v", err)
		}
		b, ok := s.bases[d.base]
		switch {
		case !ok && deltaDigests[d.base]:
			return bad("base %s is a delta chunk: a base must be a full chunk", d.base)
		case !ok:
			return bad("base %s is not a base layer of this manifest", d.base)
		case b.size != d.size:
			return bad("base %s holds %d raw bytes, the chunk %d", d.base, b.size, d.size)
		}
		users[d.base]++
	}
	for dg, b := range s.bases {
		switch n := users[dg]; {
		case n == 0:
			return fmt.Errorf("base layer %d (%s): no delta uses it: %w", b.layer, dg, errdefs.ErrInvalidArgument)
		case n > 1 && md.Encryption != nil:
			return fmt.Errorf("base layer %d (%s): %d deltas share an encrypted base, which is bound to one place: %w", b.layer, dg, n, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// forEachDelta rebuilds every delta chunk and calls fn with its raw bytes
// (valid only during the call), in parallel. Each base is fetched,
// verified and decoded once, then the deltas that name it are fetched,
// verified, decoded, checked and applied to a copy of it.
func (s *Snapshot) forEachDelta(ctx context.Context, fn func(c chunkRef, raw []byte) error) error {
	if len(s.deltas) == 0 {
		return nil
	}
	var order []digest.Digest
	groups := map[digest.Digest][]deltaRef{}
	for _, d := range s.deltas {
		if groups[d.base] == nil {
			order = append(order, d.base)
		}
		groups[d.base] = append(groups[d.base], d)
	}
	cs := s.Metadata.ChunkSize
	codec, _, workers, err := s.readCodec(2*maxStoredSize(cs)+3*cs, len(order))
	if err != nil {
		return err
	}
	defer codec.Close()
	return inParallel(ctx, order, workers, func(ctx context.Context, jobs <-chan digest.Digest) error {
		stored := make([]byte, maxStoredSize(cs)+1)
		scratch := make([]byte, maxStoredSize(cs))
		baseBuf, payloadBuf, out := make([]byte, cs), make([]byte, cs), make([]byte, cs)
		for dg := range jobs {
			ds := groups[dg]
			b := s.bases[dg]
			sb, err := fetchVerified(ctx, s.store, b.desc, maxStoredSize(cs), s.opts.RangeSize, stored)
			if err != nil {
				return fmt.Errorf("base chunk %s: %w", dg, err)
			}
			// A plaintext base ignores the place; an encrypted one has
			// exactly one delta, at the base's own place.
			base, err := codec.open(ds[0].file, ds[0].off, b.size, sb, scratch, baseBuf)
			if err != nil {
				return fmt.Errorf("base chunk %s of %s at %d: %w", dg, ds[0].file, ds[0].off, err)
			}
			for _, d := range ds {
				db, err := fetchVerified(ctx, s.store, d.desc, maxStoredSize(cs), s.opts.RangeSize, stored)
				if err != nil {
					return fmt.Errorf("delta chunk %s at %d: %w", d.file, d.off, err)
				}
				p, err := codec.openDelta(d.file, d.off, d.size, d.base, db, scratch, payloadBuf)
				if err == nil {
					err = applyDelta(p, append(out[:0], base...))
				}
				if err != nil {
					return fmt.Errorf("delta chunk %s at %d (%s): %w", d.file, d.off, d.desc.Digest, err)
				}
				if err := fn(d.chunkRef, out[:d.size]); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
