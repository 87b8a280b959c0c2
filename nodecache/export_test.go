package nodecache

import "github.com/opencontainers/go-digest"

// Helpers only tests use.

// Path returns the file of a cached blob. Pin the blob while using the path.
func (c *Blobs) Path(d digest.Digest) (string, bool) {
	if !c.touch(d) {
		return "", false
	}
	return c.blobPath(d), true
}

// Verifies reports whether the reader holds exactly the blob d of size.
func (v *VerifiedReader) Verifies(d digest.Digest, size int64) bool {
	return v != nil && v.f != nil && v.d != "" && v.d == d && v.size == size
}
