// Package stores holds the snapshot stores (file, s3/minio, oci, http), the
// node-local content-addressed cache and the single-flight downloader.
//
// Every store speaks one interface: content-addressed blobs with ranged reads,
// and references (tags) that name a manifest. Publishing is blobs first,
// reference last, so a reader never sees a reference to a missing blob.
package stores

import (
	"context"
	"io"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Store is a snapshot store. Implementations must be safe for concurrent use.
type Store interface {
	// Exists reports whether the blob named by desc.Digest is in the store.
	Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error)
	// Fetch returns length bytes of the blob starting at offset; length < 0
	// means to the end. The bytes are NOT verified: callers verify digests.
	Fetch(ctx context.Context, desc ocispec.Descriptor, offset, length int64) (io.ReadCloser, error)
	// Push stores a blob whose digest and size are in desc. Pushing a blob the
	// store already has is a no-op that does not read r.
	Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error
	// Resolve returns the manifest descriptor a reference (tag) names.
	Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error)
	// Tag points a reference at a manifest that is already pushed. It is the
	// last, atomic step of a publish.
	Tag(ctx context.Context, desc ocispec.Descriptor, ref string) error
	// Tags lists the references in the store (or in the repository the store
	// URL names).
	Tags(ctx context.Context) ([]string, error)
	// Untag removes a reference; blobs stay until garbage collection.
	Untag(ctx context.Context, ref string) error
}
