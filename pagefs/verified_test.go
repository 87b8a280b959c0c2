package pagefs

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"sync"
)

// VerifiedFile is a Source over a local file of fixed-size chunks, each
// checked against its SHA-256 digest the first time any byte of it is read.
// It stands in for the node cache in these tests: the real source
// (sandbox's served RAM) fetches a missing chunk from the store, verifies,
// decrypts and decompresses it, and writes it to the cache file before it
// answers.
type VerifiedFile struct {
	f         *os.File
	size      int64
	chunkSize int64
	digests   [][sha256.Size]byte

	mu       sync.Mutex
	verified []bool
	order    []int64 // chunks in the order they were first verified
	inflight map[int64]*sync.WaitGroup
}

// NewVerifiedFile serves f, whose chunk i of chunkSize bytes has digests[i].
func NewVerifiedFile(f *os.File, chunkSize int64, digests [][sha256.Size]byte) (*VerifiedFile, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if chunkSize <= 0 || chunkSize%PageSize != 0 {
		return nil, fmt.Errorf("chunk size %d: want a positive multiple of %d", chunkSize, PageSize)
	}
	if want := (st.Size() + chunkSize - 1) / chunkSize; int64(len(digests)) != want {
		return nil, fmt.Errorf("%d digests for %d chunks", len(digests), want)
	}
	return &VerifiedFile{f: f, size: st.Size(), chunkSize: chunkSize, digests: digests,
		verified: make([]bool, len(digests)), inflight: map[int64]*sync.WaitGroup{}}, nil
}

// ChunkDigests hashes r in chunks of chunkSize (the test side of
// NewVerifiedFile: a snapshot's record carries these).
func ChunkDigests(r io.Reader, chunkSize int64) ([][sha256.Size]byte, error) {
	var out [][sha256.Size]byte
	buf := make([]byte, chunkSize)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			out = append(out, sha256.Sum256(buf[:n]))
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// Size is the file's size.
func (v *VerifiedFile) Size() int64 { return v.size }

// ReadAt verifies every chunk that [off, off+len(p)) touches, then reads.
func (v *VerifiedFile) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= v.size {
		return 0, io.EOF
	}
	end := min(off+int64(len(p)), v.size)
	for c := off / v.chunkSize; c*v.chunkSize < end; c++ {
		if err := v.verify(c); err != nil {
			return 0, err
		}
	}
	return v.f.ReadAt(p[:end-off], off)
}

// verify checks chunk c once; concurrent readers of one chunk wait for
// the first.
func (v *VerifiedFile) verify(c int64) error {
	v.mu.Lock()
	if v.verified[c] {
		v.mu.Unlock()
		return nil
	}
	if wg, ok := v.inflight[c]; ok {
		v.mu.Unlock()
		wg.Wait()
		return v.verify(c)
	}
	wg := &sync.WaitGroup{}
	wg.Add(1)
	v.inflight[c] = wg
	v.mu.Unlock()

	err := v.check(c)
	v.mu.Lock()
	delete(v.inflight, c)
	if err == nil {
		v.verified[c] = true
		v.order = append(v.order, c)
	}
	v.mu.Unlock()
	wg.Done()
	return err
}

func (v *VerifiedFile) check(c int64) error {
	n := min(v.chunkSize, v.size-c*v.chunkSize)
	buf := make([]byte, n)
	if _, err := v.f.ReadAt(buf, c*v.chunkSize); err != nil && err != io.EOF {
		return fmt.Errorf("chunk %d: %w", c, err)
	}
	if sum := sha256.Sum256(buf); !bytes.Equal(sum[:], v.digests[c][:]) {
		return fmt.Errorf("chunk %d: digest mismatch", c)
	}
	return nil
}

// Verified reports how many chunks have been verified so far.
func (v *VerifiedFile) Verified() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, ok := range v.verified {
		if ok {
			n++
		}
	}
	return n
}

// Order returns the chunks verified so far, in the order they were first
// read: the working set a snapshot's first lazy restore records for the
// prefetch of the next ones.
func (v *VerifiedFile) Order() []int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]int64(nil), v.order...)
}
