package stores

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// GCStore is implemented by stores whose blobs can be listed and deleted
// (file, s3). Registries collect their own garbage.
type GCStore interface {
	Store
	// Roots returns every manifest that keeps blobs of this store's blob
	// pool alive (for s3: every name under the prefix).
	Roots(ctx context.Context) ([]ocispec.Descriptor, error)
	// Blobs calls fn for each stored blob.
	Blobs(ctx context.Context, fn func(BlobInfo) error) error
	// Delete removes one blob.
	Delete(ctx context.Context, d digest.Digest) error
}

// unwrapper is implemented by store wrappers.
type unwrapper interface{ Unwrap() Store }

// AsGCStore returns the GCStore under s (looking through wrappers such as
// the one Open returns), or false when the backend cannot collect garbage.
func AsGCStore(s Store) (GCStore, bool) {
	for {
		if g, ok := s.(GCStore); ok {
			return g, true
		}
		u, ok := s.(unwrapper)
		if !ok {
			return nil, false
		}
		s = u.Unwrap()
	}
}

// GCOptions tune GC.
type GCOptions struct {
	// Grace keeps unreferenced blobs younger than this: they may belong to
	// a publish in progress, whose reference is written last (default 1h).
	Grace time.Duration
	// DryRun reports what would be deleted without deleting.
	DryRun bool
	// Keep are blobs to keep though no reference reaches them: what the
	// node's running lazy sandboxes still read (their snapshot may have
	// expired or been untagged meanwhile).
	Keep []digest.Digest
}

// GCResult is what GC found and removed.
type GCResult struct {
	Reachable    int   `json:"reachable"`
	Deleted      int   `json:"deleted"`
	DeletedBytes int64 `json:"deletedBytes"`
	Kept         int   `json:"keptYoung"`
}

// GC deletes the blobs that no manifest reachable from the store's roots
// references and that are older than the grace period.
func GC(ctx context.Context, s Store, opts GCOptions) (GCResult, error) {
	var res GCResult
	g, ok := AsGCStore(s)
	if !ok {
		return res, fmt.Errorf("gc: store cannot list blobs: %w", errdefs.ErrNotImplemented)
	}
	if opts.Grace == 0 {
		opts.Grace = time.Hour
	}
	roots, err := g.Roots(ctx)
	if err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	live := map[digest.Digest]bool{}
	for _, r := range roots {
		if err := Walk(ctx, s, r, func(d ocispec.Descriptor) error { live[d.Digest] = true; return nil }); err != nil {
			return res, fmt.Errorf("gc: walk %s: %w", r.Digest, err)
		}
	}
	res.Reachable = len(live)
	for _, d := range opts.Keep {
		live[d] = true
	}
	cutoff := time.Now().Add(-opts.Grace)
	var doomed []BlobInfo
	if err := g.Blobs(ctx, func(b BlobInfo) error {
		switch {
		case live[b.Digest]:
		case b.ModTime.After(cutoff):
			res.Kept++
		default:
			doomed = append(doomed, b)
		}
		return nil
	}); err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	for _, b := range doomed {
		if !opts.DryRun {
			if err := g.Delete(ctx, b.Digest); err != nil && !errdefs.IsNotFound(err) {
				return res, fmt.Errorf("gc: %w", err)
			}
		}
		log.G(ctx).WithField("digest", b.Digest).Debug("gc: deleted unreferenced blob")
		res.Deleted++
		res.DeletedBytes += b.Size
	}
	return res, nil
}

// Walk calls fn for desc and, when desc is a manifest or index, for every
// descriptor it references (config, layers, subject, manifests), fetching
// and parsing manifests from s. Manifests are verified against their digest.
func Walk(ctx context.Context, s Store, desc ocispec.Descriptor, fn func(ocispec.Descriptor) error) error {
	seen := map[digest.Digest]bool{}
	var walk func(d ocispec.Descriptor) error
	walk = func(d ocispec.Descriptor) error {
		if seen[d.Digest] {
			return nil
		}
		seen[d.Digest] = true
		if err := fn(d); err != nil {
			return err
		}
		if d.MediaType != ocispec.MediaTypeImageManifest && d.MediaType != ocispec.MediaTypeImageIndex {
			return nil
		}
		b, err := FetchAll(ctx, s, d, maxManifestSize)
		if err != nil {
			return err
		}
		var m struct {
			Config    *ocispec.Descriptor  `json:"config"`
			Layers    []ocispec.Descriptor `json:"layers"`
			Manifests []ocispec.Descriptor `json:"manifests"`
			Blobs     []ocispec.Descriptor `json:"blobs"`
			Subject   *ocispec.Descriptor  `json:"subject"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("parse manifest %s: %w: %w", d.Digest, err, errdefs.ErrDataLoss)
		}
		children := append(append(append([]ocispec.Descriptor{}, m.Layers...), m.Manifests...), m.Blobs...)
		if m.Config != nil {
			children = append(children, *m.Config)
		}
		if m.Subject != nil {
			children = append(children, *m.Subject)
		}
		for _, c := range children {
			if err := walk(c); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(desc)
}

// FetchAll reads a whole (small) blob and verifies its digest and size.
func FetchAll(ctx context.Context, s Store, desc ocispec.Descriptor, limit int64) ([]byte, error) {
	if desc.Size > limit {
		return nil, fmt.Errorf("blob %s: %d bytes, more than %d: %w", desc.Digest, desc.Size, limit, errdefs.ErrInvalidArgument)
	}
	rc, err := s.Fetch(ctx, desc, 0, -1)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := readLimited(rc, limit)
	if err != nil {
		return nil, fmt.Errorf("read blob %s: %w", desc.Digest, err)
	}
	if err := verifyBytes(desc, b); err != nil {
		return nil, err
	}
	return b, nil
}

// ErrDigestMismatch is wrapped (with errdefs.ErrDataLoss) by every error
// that reports content not matching its descriptor.
var ErrDigestMismatch = errors.New("content does not match its digest")

func verifyBytes(desc ocispec.Descriptor, b []byte) error {
	if err := desc.Digest.Validate(); err != nil {
		return fmt.Errorf("digest %q: %w: %w", desc.Digest, err, errdefs.ErrInvalidArgument)
	}
	if desc.Size >= 0 && int64(len(b)) != desc.Size {
		return fmt.Errorf("blob %s: %d bytes, descriptor says %d: %w: %w", desc.Digest, len(b), desc.Size, ErrDigestMismatch, errdefs.ErrDataLoss)
	}
	if desc.Digest.Algorithm().FromBytes(b) != desc.Digest {
		return fmt.Errorf("blob %s: %w: %w", desc.Digest, ErrDigestMismatch, errdefs.ErrDataLoss)
	}
	return nil
}
