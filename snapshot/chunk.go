package snapshot

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"runtime"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/zstd"
)

const (
	gcmNonceSize = 12
	gcmTagSize   = 16
	// sealOverhead is what encryption adds to a compressed chunk.
	sealOverhead = gcmNonceSize + gcmTagSize
)

// maxStoredSize is the largest stored chunk a chunk size allows: zstd's
// worst case (raw blocks: 3 bytes per 128 KiB block plus the frame header)
// with generous slack, plus the encryption overhead.
func maxStoredSize(chunkSize int64) int64 {
	return chunkSize + chunkSize/1024 + 4096 + sealOverhead
}

// chunkCodec turns raw chunks into stored chunks and back. It is safe for
// concurrent use.
type chunkCodec struct {
	chunkSize int64
	enc       *zstd.Encoder
	dec       *zstd.Decoder
	aead      cipher.AEAD // nil: plaintext
	nonceKey  []byte
	// lineage, when set (format version 3), is bound into every chunk's
	// and delta's AAD.
	lineage string
}

// newChunkCodec returns a codec for chunks of at most chunkSize raw bytes.
// key is nil or a 32-byte AES-256 key. workers bounds concurrent
// (de)compressions.
func newChunkCodec(chunkSize int64, key []byte, level zstd.EncoderLevel, workers int, encode bool) (*chunkCodec, error) {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	c := &chunkCodec{chunkSize: chunkSize}
	var err error
	if encode {
		c.enc, err = zstd.NewWriter(nil,
			zstd.WithEncoderLevel(level),
			zstd.WithEncoderConcurrency(workers),
			zstd.WithWindowSize(int(min(chunkSize, 8<<20))),
			zstd.WithEncoderCRC(true))
	} else {
		// Bounded decoder: one frame may neither declare a window larger
		// than a chunk nor decode to more than a chunk. DecodeAll is also
		// capped at cap(dst), which is the annotated raw size.
		c.dec, err = zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(workers),
			zstd.WithDecoderMaxMemory(uint64(chunkSize)),
			zstd.WithDecoderMaxWindow(uint64(max(chunkSize, zstd.MinWindowSize))),
			zstd.WithDecodeAllCapLimit(true),
			// Every stored chunk is verified against its sha256 before it
			// is decoded; zstd's own xxhash would check the same bytes
			// again (about 4% of a restore's CPU, cryoctl bench).
			zstd.IgnoreChecksum(true),
			zstd.WithDecoderLowmem(true))
	}
	if err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	if key != nil {
		if len(key) != 32 {
			return nil, fmt.Errorf("encryption key is %d bytes, want 32: %w", len(key), errdefs.ErrInvalidArgument)
		}
		block, err := aes.NewCipher(deriveKey(key, "cryo chunk aes-256-gcm v1"))
		if err != nil {
			return nil, err
		}
		if c.aead, err = cipher.NewGCM(block); err != nil {
			return nil, err
		}
		c.nonceKey = deriveKey(key, "cryo chunk nonce v1")
	}
	return c, nil
}

// Close releases the codec's zstd state.
func (c *chunkCodec) Close() {
	if c.enc != nil {
		c.enc.Close()
	}
	if c.dec != nil {
		c.dec.Close()
	}
}

func (c *chunkCodec) mediaType() string {
	if c.aead != nil {
		return MediaTypeChunkEncrypted
	}
	return MediaTypeChunk
}

// deriveKey derives a purpose-bound 32-byte key from the master key.
func deriveKey(master []byte, purpose string) []byte {
	m := hmac.New(sha256.New, master)
	m.Write([]byte(purpose))
	return m.Sum(nil)
}

// chunkAAD binds a sealed chunk to its place: a chunk moved to another file
// or offset fails to open. From format version 3 it also binds the
// snapshot's lineage: a chunk of another lineage fails to open.
func (c *chunkCodec) chunkAAD(file string, off, rawSize int64) []byte {
	aad := make([]byte, 0, 64+len(file))
	if c.lineage != "" {
		aad = append(aad, "cryo-chunk-v3\x00"...)
		aad = append(aad, c.lineage...)
		aad = append(aad, 0)
	} else {
		aad = append(aad, "cryo-chunk-v1\x00"...)
	}
	aad = append(aad, file...)
	aad = append(aad, 0)
	aad = binary.BigEndian.AppendUint64(aad, uint64(off))
	return binary.BigEndian.AppendUint64(aad, uint64(rawSize))
}

// seal compresses raw (the chunk of file at off) into dst[:0] and, when the
// codec encrypts, seals it. The nonce is synthetic (HMAC of the place and the
// compressed bytes under a derived key, as in SIV modes) rather than random:
// the same chunk at the same place encrypts to the same bytes, so a repeated
// encrypted snapshot still uploads only the chunks that changed. A nonce
// repeats only for identical plaintext at an identical place, which reveals
// nothing but that equality.
func (c *chunkCodec) seal(file string, off int64, raw, scratch, dst []byte) []byte {
	return c.sealAAD(c.chunkAAD(file, off, int64(len(raw))), raw, scratch, dst)
}

// sealAAD is seal with the associated data given (delta chunks bind more
// than the place).
func (c *chunkCodec) sealAAD(aad, raw, scratch, dst []byte) []byte {
	if c.aead == nil {
		return c.enc.EncodeAll(raw, dst[:0])
	}
	z := c.enc.EncodeAll(raw, scratch[:0])
	m := hmac.New(sha256.New, c.nonceKey)
	m.Write(aad)
	m.Write(z)
	nonce := m.Sum(nil)[:gcmNonceSize]
	out := append(dst[:0], nonce...)
	return c.aead.Seal(out, nonce, z, aad)
}

// open reverses seal for a chunk whose stored bytes were already verified
// against their digest: it decrypts (checking the place), decompresses with a
// bounded decoder into dst (cap(dst) must be >= rawSize) and insists that the
// result is exactly rawSize bytes.
func (c *chunkCodec) open(file string, off, rawSize int64, stored, scratch, dst []byte) ([]byte, error) {
	out, err := c.openAAD(c.chunkAAD(file, off, rawSize), rawSize, stored, scratch, dst)
	if err != nil {
		return nil, err
	}
	if int64(len(out)) != rawSize {
		return nil, fmt.Errorf("chunk decompressed to %d bytes, manifest says %d: %w", len(out), rawSize, errdefs.ErrDataLoss)
	}
	return out, nil
}

// openAAD decrypts stored with the associated data aad (when the codec
// decrypts) and decompresses it into dst, refusing more than limit bytes
// (cap(dst) must be >= limit).
func (c *chunkCodec) openAAD(aad []byte, limit int64, stored, scratch, dst []byte) ([]byte, error) {
	z := stored
	if c.aead != nil {
		if len(stored) < sealOverhead {
			return nil, fmt.Errorf("sealed chunk too short (%d bytes): %w", len(stored), errdefs.ErrDataLoss)
		}
		var err error
		z, err = c.aead.Open(scratch[:0], stored[:gcmNonceSize], stored[gcmNonceSize:], aad)
		if err != nil {
			return nil, fmt.Errorf("decrypt chunk: %v: %w", err, errdefs.ErrDataLoss)
		}
	}
	if int64(cap(dst)) < limit || limit > c.chunkSize {
		return nil, fmt.Errorf("raw size %d over buffer: %w", limit, errdefs.ErrInvalidArgument)
	}
	out, err := c.dec.DecodeAll(z, dst[:0:limit])
	if err != nil {
		return nil, fmt.Errorf("decompress chunk: %v: %w", err, errdefs.ErrDataLoss)
	}
	return out, nil
}
