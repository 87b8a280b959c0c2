package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/stores"
)

// pageHashSize is the length of a page hash: sha256 truncated to 128 bits.
// The guest chooses its memory, so the hash must resist collisions; a
// page the hash wrongly calls unchanged would still be caught on restore
// by the delta's whole-chunk sha256.
const pageHashSize = 16

// pageIndexVersion is the version of the page index file.
const pageIndexVersion = 1

// PageIndex records, for every stored chunk of a snapshot, the full chunk
// that the next snapshot of the same files may store a delta against (its
// base: the chunk itself, or the base of the delta that stored it) and a
// hash of each of the base's raw pages. It holds hashes and digests, never
// data. Write makes one (WriteOptions.IndexPath) and uses one
// (WriteOptions.Base); LoadPageIndex reads it back.
type PageIndex struct {
	chunkSize int64
	keyID     string // "" for plaintext
	lineage   string // "" for plaintext and before format version 3
	store     string
	manifest  digest.Digest
	entries   map[pagePlace]*pageEntry
}

type pagePlace struct {
	file string
	off  int64
}

// pageEntry is the base of one place.
type pageEntry struct {
	// base has the media type, digest and stored size of the full chunk.
	base ocispec.Descriptor
	// size is the base's raw size.
	size int64
	// pages holds pageHashSize bytes per page of the base's raw bytes.
	pages []byte
}

// Manifest is the digest of the snapshot the index was made with.
func (x *PageIndex) Manifest() digest.Digest { return x.manifest }

// Len is the number of chunks the index records.
func (x *PageIndex) Len() int { return len(x.entries) }

// mismatch says why the index cannot serve a write with these parameters,
// or "" when it can.
func (x *PageIndex) mismatch(chunkSize int64, keyID, lineage, store string) string {
	switch {
	case x.chunkSize != chunkSize:
		return fmt.Sprintf("chunk size %d, the write uses %d", x.chunkSize, chunkSize)
	case x.keyID != keyID:
		return fmt.Sprintf("encryption key %q, the write uses %q", x.keyID, keyID)
	case x.lineage != lineage:
		return fmt.Sprintf("lineage %q, the write seals lineage %q", x.lineage, lineage)
	case x.store != store:
		return fmt.Sprintf("made for store %q, the write goes to %q", x.store, store)
	}
	return ""
}

// pageHashes appends the hashes of raw's pages to dst[:0].
func pageHashes(dst, raw []byte) []byte {
	dst = dst[:0]
	for s := 0; s < len(raw); s += PageSize {
		h := sha256.Sum256(raw[s:min(s+PageSize, len(raw))])
		dst = append(dst, h[:pageHashSize]...)
	}
	return dst
}

// changedPages appends to dst[:0] the indexes of the pages whose hashes
// differ between a and b (of equal length).
func changedPages(dst []int, a, b []byte) []int {
	dst = dst[:0]
	for i := 0; i*pageHashSize < len(a); i++ {
		s := i * pageHashSize
		if !bytes.Equal(a[s:s+pageHashSize], b[s:s+pageHashSize]) {
			dst = append(dst, i)
		}
	}
	return dst
}

// The index file: JSON, the index and its sha256 (a torn or damaged file
// is refused, not half used).
type pageIndexFile struct {
	SHA256 string          `json:"sha256"`
	Index  json.RawMessage `json:"index"`
}

type pageIndexJSON struct {
	Version   int             `json:"version"`
	ChunkSize int64           `json:"chunkSize"`
	KeyID     string          `json:"keyID,omitempty"`
	Lineage   string          `json:"lineage,omitempty"`
	Store     string          `json:"store"`
	Manifest  digest.Digest   `json:"manifest"`
	Chunks    []pageEntryJSON `json:"chunks"`
}

type pageEntryJSON struct {
	File      string        `json:"file"`
	Offset    int64         `json:"offset"`
	Size      int64         `json:"size"`
	MediaType string        `json:"mediaType"`
	Digest    digest.Digest `json:"digest"`
	Stored    int64         `json:"stored"`
	Pages     []byte        `json:"pages"`
}

// save writes the index to path (0600), replacing it atomically.
func (x *PageIndex) save(path string) error {
	j := pageIndexJSON{Version: pageIndexVersion, ChunkSize: x.chunkSize, KeyID: x.keyID, Lineage: x.lineage, Store: x.store,
		Manifest: x.manifest, Chunks: make([]pageEntryJSON, 0, len(x.entries))}
	for p, e := range x.entries {
		j.Chunks = append(j.Chunks, pageEntryJSON{File: p.file, Offset: p.off, Size: e.size,
			MediaType: e.base.MediaType, Digest: e.base.Digest, Stored: e.base.Size, Pages: e.pages})
	}
	sort.Slice(j.Chunks, func(a, b int) bool {
		if j.Chunks[a].File != j.Chunks[b].File {
			return j.Chunks[a].File < j.Chunks[b].File
		}
		return j.Chunks[a].Offset < j.Chunks[b].Offset
	})
	body, err := json.Marshal(j)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	b, err := json.Marshal(pageIndexFile{SHA256: hex.EncodeToString(sum[:]), Index: body})
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".pageindex-")
	if err != nil {
		return fmt.Errorf("save page index: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("save page index: %w", err)
	}
	return nil
}

// LoadPageIndex reads a page index that Write saved (WriteOptions.IndexPath)
// and checks it. It does not check that its bases are still in a store:
// Write does, per chunk.
func LoadPageIndex(path string) (*PageIndex, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load page index: %w", err)
	}
	x, err := parsePageIndex(b)
	if err != nil {
		return nil, fmt.Errorf("load page index %s: %w", path, err)
	}
	return x, nil
}

func parsePageIndex(b []byte) (*PageIndex, error) {
	var f pageIndexFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrDataLoss)
	}
	if sum := sha256.Sum256(f.Index); hex.EncodeToString(sum[:]) != f.SHA256 {
		return nil, fmt.Errorf("checksum mismatch: %w", errdefs.ErrDataLoss)
	}
	var j pageIndexJSON
	if err := json.Unmarshal(f.Index, &j); err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrDataLoss)
	}
	if j.Version != pageIndexVersion {
		return nil, fmt.Errorf("version %d, this cryo reads %d: %w", j.Version, pageIndexVersion, errdefs.ErrNotImplemented)
	}
	if err := checkChunkSize(j.ChunkSize); err != nil {
		return nil, err
	}
	wantType := MediaTypeChunk
	if j.KeyID != "" {
		wantType = MediaTypeChunkEncrypted
	}
	if j.Lineage != "" {
		if j.KeyID == "" {
			return nil, fmt.Errorf("a plaintext index with a lineage: %w", errdefs.ErrInvalidArgument)
		}
		if err := checkLineage(j.Lineage); err != nil {
			return nil, err
		}
	}
	x := &PageIndex{chunkSize: j.ChunkSize, keyID: j.KeyID, lineage: j.Lineage, store: j.Store, manifest: j.Manifest,
		entries: make(map[pagePlace]*pageEntry, len(j.Chunks))}
	for _, c := range j.Chunks {
		bad := func(format string, a ...any) error {
			return fmt.Errorf("chunk %s at %d: %s: %w", c.File, c.Offset, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
		}
		if err := validFileName(c.File); err != nil {
			return nil, bad("%v", err)
		}
		if c.Offset < 0 || c.Offset%j.ChunkSize != 0 || c.Size <= 0 || c.Size > j.ChunkSize {
			return nil, bad("offset or raw size %d does not fit chunk size %d", c.Size, j.ChunkSize)
		}
		if err := stores.CheckDigest(c.Digest); err != nil {
			return nil, bad("%v", err)
		}
		if c.MediaType != wantType || c.Stored <= 0 || c.Stored > maxStoredSize(j.ChunkSize) {
			return nil, bad("base %q of %d bytes, want a %q", c.MediaType, c.Stored, wantType)
		}
		if pages, _ := deltaGeometry(c.Size); len(c.Pages) != pages*pageHashSize {
			return nil, bad("%d bytes of page hashes for %d pages", len(c.Pages), pages)
		}
		p := pagePlace{c.File, c.Offset}
		if x.entries[p] != nil {
			return nil, bad("listed twice")
		}
		x.entries[p] = &pageEntry{base: ocispec.Descriptor{MediaType: c.MediaType, Digest: c.Digest, Size: c.Stored},
			size: c.Size, pages: c.Pages}
	}
	return x, nil
}
