package snapshot

import "sort"

// FileChunks returns the stored chunks of the file name in offset order
// (none for a file that is all holes or absent), as FileReader.Chunks
// does without a reader: a checkpoint's next parent.
func (s *Snapshot) FileChunks(name string) []ChunkDesc {
	var out []ChunkDesc
	for _, c := range s.chunks {
		if c.file == name {
			out = append(out, ChunkDesc{Offset: c.off, Size: c.size, Stored: c.desc})
		}
	}
	for _, d := range s.deltas {
		if d.file != name {
			continue
		}
		b := s.bases[d.base].desc
		out = append(out, ChunkDesc{Offset: d.off, Size: d.size, Stored: d.desc, Base: &b})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Offset < out[b].Offset })
	return out
}
