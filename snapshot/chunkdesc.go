package snapshot

import (
	"sort"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ChunkDesc is one stored chunk of a snapshot file as its manifest lists
// it: where its raw bytes go, its layer (a full chunk or a delta) and, for
// a delta, its base layer. A later snapshot of the same file may reuse it
// without reading it (see Parent).
type ChunkDesc struct {
	// Offset and Size place the chunk's raw bytes in the file.
	Offset, Size int64
	// Desc is the placed layer.
	Desc ocispec.Descriptor
	// Base is the base layer of a delta chunk; nil for a full chunk.
	Base *ocispec.Descriptor
}

// FileChunks returns the stored chunks of the file name in offset order
// (none for a file that is all holes or absent). Holes and zero chunks
// are not listed.
func (s *Snapshot) FileChunks(name string) []ChunkDesc {
	var out []ChunkDesc
	for _, c := range s.chunks {
		if c.file == name {
			out = append(out, ChunkDesc{Offset: c.off, Size: c.size, Desc: c.desc})
		}
	}
	for _, d := range s.deltas {
		if d.file != name {
			continue
		}
		b := s.bases[d.base].desc
		out = append(out, ChunkDesc{Offset: d.off, Size: d.size, Desc: d.desc, Base: &b})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Offset < out[b].Offset })
	return out
}
