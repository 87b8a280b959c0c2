package stores

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// CopyVerified copies r to w, failing on more or fewer bytes than
// desc.Size or a digest mismatch (ErrDigestMismatch with
// errdefs.ErrDataLoss). It stops when ctx is done.
func CopyVerified(ctx context.Context, w io.Writer, r io.Reader, desc ocispec.Descriptor) (int64, error) {
	if err := desc.Digest.Validate(); err != nil {
		return 0, fmt.Errorf("digest %q: %w: %w", desc.Digest, err, errdefs.ErrInvalidArgument)
	}
	v := desc.Digest.Verifier()
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	n, err := io.CopyBuffer(io.MultiWriter(w, v), io.LimitReader(ctxReader{ctx, r}, desc.Size+1), *buf)
	if err != nil {
		return n, fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	if n != desc.Size {
		return n, fmt.Errorf("blob %s: got %s bytes, descriptor says %d: %w: %w", desc.Digest, sizeDesc(n, desc.Size), desc.Size, ErrDigestMismatch, errdefs.ErrDataLoss)
	}
	if !v.Verified() {
		return n, fmt.Errorf("blob %s: %w (store content changed or corrupt): %w", desc.Digest, ErrDigestMismatch, errdefs.ErrDataLoss)
	}
	return n, nil
}

// copyBufs are CopyVerified's buffers: large enough that a blob of a few
// MiB from a local store takes a few reads and writes, not hundreds.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

func sizeDesc(n, want int64) string {
	if n > want {
		return fmt.Sprintf("more than %d", want)
	}
	return fmt.Sprint(n)
}
