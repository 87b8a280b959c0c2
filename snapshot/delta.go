package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
)

// A delta chunk's raw payload (before zstd and sealing) is
//
//	sha256 of the whole raw chunk it rebuilds   32 bytes
//	bitmap of the pages it holds                ceil(pages/8) bytes, page i is
//	                                            bit i%8 (LSB first) of byte i/8
//	the pages whose bit is set, in page order   PageSize bytes each, but the
//	                                            chunk's last page, which may be
//	                                            shorter
//
// where pages = ceil(rawSize/PageSize). The pages not in the bitmap are the
// base chunk's. A payload is never longer than its chunk's raw size (the
// writer stores a full chunk long before that) and holds at least one page.

const deltaSumSize = sha256.Size

// deltaGeometry returns the page count of a chunk of rawSize bytes and the
// length of its delta bitmap.
func deltaGeometry(rawSize int64) (pages, bitmapLen int) {
	pages = int((rawSize + PageSize - 1) / PageSize)
	return pages, (pages + 7) / 8
}

// pageSpan returns the bounds of page i in a chunk of rawSize bytes.
func pageSpan(i int, rawSize int64) (int64, int64) {
	start := int64(i) * PageSize
	return start, min(start+PageSize, rawSize)
}

// deltaPayloadSize is the payload length of a delta of a chunk of rawSize
// bytes holding the pages changed.
func deltaPayloadSize(rawSize int64, changed []int) int64 {
	_, bm := deltaGeometry(rawSize)
	n := int64(deltaSumSize + bm)
	for _, i := range changed {
		s, e := pageSpan(i, rawSize)
		n += e - s
	}
	return n
}

// appendDeltaPayload appends to dst the payload of the delta that turns a
// base into raw, given the (increasing) indexes of the pages that differ.
func appendDeltaPayload(dst, raw []byte, changed []int) []byte {
	size := int64(len(raw))
	sum := sha256.Sum256(raw)
	dst = append(dst, sum[:]...)
	_, bm := deltaGeometry(size)
	at := len(dst)
	dst = append(dst, make([]byte, bm)...)
	for _, i := range changed {
		dst[at+i/8] |= 1 << (i % 8)
	}
	for _, i := range changed {
		s, e := pageSpan(i, size)
		dst = append(dst, raw[s:e]...)
	}
	return dst
}

// applyDelta checks payload against the chunk out (which holds the base's
// raw bytes, len(out) is the chunk's raw size), writes its pages over out
// and verifies that the result is the chunk the writer read.
func applyDelta(payload, out []byte) error {
	size := int64(len(out))
	pages, bm := deltaGeometry(size)
	if len(payload) < deltaSumSize+bm {
		return fmt.Errorf("delta payload of %d bytes, shorter than its header (%d): %w", len(payload), deltaSumSize+bm, errdefs.ErrDataLoss)
	}
	sum, bitmap, data := payload[:deltaSumSize], payload[deltaSumSize:deltaSumSize+bm], payload[deltaSumSize+bm:]
	if extra := pages % 8; extra != 0 && bitmap[bm-1]>>extra != 0 {
		return fmt.Errorf("delta bitmap names pages beyond the chunk's %d: %w", pages, errdefs.ErrDataLoss)
	}
	var n int
	want := int64(0)
	for k, b := range bitmap {
		n += bits.OnesCount8(b)
		for b != 0 {
			i := k*8 + bits.TrailingZeros8(b)
			b &= b - 1
			s, e := pageSpan(i, size)
			want += e - s
		}
	}
	if n == 0 {
		return fmt.Errorf("delta holds no page: %w", errdefs.ErrDataLoss)
	}
	if int64(len(data)) != want {
		return fmt.Errorf("delta bitmap names %d pages (%d bytes), payload holds %d bytes: %w", n, want, len(data), errdefs.ErrDataLoss)
	}
	for k, b := range bitmap {
		for b != 0 {
			i := k*8 + bits.TrailingZeros8(b)
			b &= b - 1
			s, e := pageSpan(i, size)
			data = data[copy(out[s:e], data):]
		}
	}
	if got := sha256.Sum256(out); !bytes.Equal(got[:], sum) {
		return fmt.Errorf("chunk rebuilt from its base and delta has sha256 %x, the writer read %x: %w", got, sum, errdefs.ErrDataLoss)
	}
	return nil
}

// deltaAAD binds a sealed delta to its place and to its base: a delta
// cannot be moved, nor applied to another base, nor read as a full chunk,
// nor (version 3) read in a snapshot of another lineage.
func (c *chunkCodec) deltaAAD(file string, off, rawSize int64, base digest.Digest) []byte {
	aad := make([]byte, 0, 72+len(file)+len(base))
	if c.lineage != "" {
		aad = append(aad, "cryo-delta-v3\x00"...)
		aad = append(aad, c.lineage...)
		aad = append(aad, 0)
	} else {
		aad = append(aad, "cryo-delta-v1\x00"...)
	}
	aad = append(aad, file...)
	aad = append(aad, 0)
	aad = binary.BigEndian.AppendUint64(aad, uint64(off))
	aad = binary.BigEndian.AppendUint64(aad, uint64(rawSize))
	return append(aad, base...)
}

// deltaMediaType is the media type of the codec's delta chunks.
func (c *chunkCodec) deltaMediaType() string {
	if c.aead != nil {
		return MediaTypeDeltaEncrypted
	}
	return MediaTypeDelta
}

// sealDelta compresses and (when the codec encrypts) seals a delta payload
// of the chunk of file at off (rawSize bytes) against base into dst[:0].
// The nonce is synthetic as in seal.
func (c *chunkCodec) sealDelta(file string, off, rawSize int64, base digest.Digest, payload, scratch, dst []byte) []byte {
	return c.sealAAD(c.deltaAAD(file, off, rawSize, base), payload, scratch, dst)
}

// openDelta reverses sealDelta for verified stored bytes: the payload is
// decompressed into dst (cap(dst) >= rawSize) and may not exceed rawSize.
func (c *chunkCodec) openDelta(file string, off, rawSize int64, base digest.Digest, stored, scratch, dst []byte) ([]byte, error) {
	return c.openAAD(c.deltaAAD(file, off, rawSize, base), rawSize, stored, scratch, dst)
}
