package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
)

// readFull reads until b is full or the reader ends.
func readFull(r io.Reader, b []byte) (int, error) {
	n, err := io.ReadFull(r, b)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = nil
	}
	return n, err
}

// sha256Digest is digest.FromBytes without the algorithm indirection.
func sha256Digest(b []byte) digest.Digest {
	h := sha256.Sum256(b)
	return digest.Digest("sha256:" + hex.EncodeToString(h[:]))
}

// fetchVerified reads the whole blob desc into buf (grown when too small)
// and returns it only when its size and sha256 match desc. The blob is read
// in ranges of at most rangeSize bytes (<= 0: one read); a store that hands
// out more or fewer bytes than asked, or that changes the object between two
// ranges, is caught here. limit bounds desc.Size before anything is read.
//
// The node cache verified its blobs when they entered it and says so by
// being a nodecache.VerifiedFetcher: its blob is read whole and not hashed a
// second time. Bytes from any other store are hashed here, before anyone
// decrypts or decompresses them.
func fetchVerified(ctx context.Context, store stores.Store, desc ocispec.Descriptor, limit, rangeSize int64, buf []byte) ([]byte, error) {
	if err := stores.CheckDigest(desc.Digest); err != nil {
		return nil, err
	}
	if desc.Size < 0 || desc.Size > limit {
		return nil, fmt.Errorf("blob %s: size %d outside [0, %d]: %w", desc.Digest, desc.Size, limit, errdefs.ErrInvalidArgument)
	}
	if int64(cap(buf)) < desc.Size+1 {
		buf = make([]byte, desc.Size+1)
	}
	buf = buf[:desc.Size+1]
	if vf, ok := store.(nodecache.VerifiedFetcher); ok {
		return readVerified(ctx, vf, desc, buf[:desc.Size])
	}
	if rangeSize <= 0 {
		rangeSize = max(desc.Size, 1)
	}
	for off := int64(0); off < desc.Size || off == 0; off += rangeSize {
		n := min(rangeSize, desc.Size-off)
		if err := fetchRange(ctx, store, desc, off, n, buf[off:off+n+1]); err != nil {
			return nil, err
		}
	}
	b := buf[:desc.Size]
	if got := sha256Digest(b); got != desc.Digest {
		return nil, fmt.Errorf("blob %s: content has digest %s: %w", desc.Digest, got, errdefs.ErrDataLoss)
	}
	return b, nil
}

// readVerified reads the whole blob desc, which the node cache verified,
// into b (len(b) == desc.Size).
func readVerified(ctx context.Context, vf nodecache.VerifiedFetcher, desc ocispec.Descriptor, b []byte) ([]byte, error) {
	v, err := vf.FetchVerified(ctx, desc)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", desc.Digest, err)
	}
	defer v.Close()
	if v.Size() != desc.Size {
		return nil, fmt.Errorf("read cached %s: %d bytes, descriptor says %d: %w", desc.Digest, v.Size(), desc.Size, errdefs.ErrDataLoss)
	}
	if got, err := v.ReadAt(b, 0); got != len(b) {
		return nil, fmt.Errorf("read cached %s: %d of %d bytes: %v: %w", desc.Digest, got, len(b), err, errdefs.ErrDataLoss)
	}
	return b, nil
}

// fetchRange reads exactly n bytes at off into b[:n]; b has one byte more to
// notice a store that returns more than it was asked for.
func fetchRange(ctx context.Context, store stores.Store, desc ocispec.Descriptor, off, n int64, b []byte) error {
	rc, err := store.Fetch(ctx, desc, off, n)
	if err != nil {
		return fmt.Errorf("fetch %s [%d,+%d): %w", desc.Digest, off, n, err)
	}
	defer rc.Close()
	got, err := readFull(rc, b)
	if err != nil {
		return fmt.Errorf("fetch %s [%d,+%d): %w", desc.Digest, off, n, err)
	}
	switch {
	case int64(got) < n:
		return fmt.Errorf("fetch %s [%d,+%d): truncated after %d bytes: %w", desc.Digest, off, n, got, errdefs.ErrDataLoss)
	case int64(got) > n:
		return fmt.Errorf("fetch %s [%d,+%d): store returned extra bytes: %w", desc.Digest, off, n, errdefs.ErrDataLoss)
	}
	return nil
}

// pushIfMissing pushes b as desc unless the store has it; it reports whether
// it uploaded.
func pushIfMissing(ctx context.Context, store stores.Store, desc ocispec.Descriptor, b []byte) (bool, error) {
	ok, err := store.Exists(ctx, desc)
	if err != nil {
		return false, fmt.Errorf("exists %s: %w", desc.Digest, err)
	}
	if ok {
		return false, nil
	}
	if err := store.Push(ctx, desc, bytes.NewReader(b)); err != nil && !errdefs.IsAlreadyExists(err) {
		return false, fmt.Errorf("push %s: %w", desc.Digest, err)
	}
	return true, nil
}
