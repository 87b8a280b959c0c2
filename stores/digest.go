package stores

import (
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
)

// CheckDigest refuses anything but a well-formed sha256 digest. A digest
// from a snapshot or a store names blobs, files and directories on this
// node: it passes here before it is used.
func CheckDigest(d digest.Digest) error {
	// Validate first: Algorithm panics on a digest without ':'.
	if err := d.Validate(); err != nil {
		return fmt.Errorf("digest %q: %v: %w", d, err, errdefs.ErrInvalidArgument)
	}
	if d.Algorithm() != digest.SHA256 {
		return fmt.Errorf("digest %q: only sha256 is accepted: %w", d, errdefs.ErrInvalidArgument)
	}
	return nil
}
