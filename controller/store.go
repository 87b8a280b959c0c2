package controller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// OpenStore opens a store URL (stores.Open with the controller's options).
type OpenStore func(ctx context.Context, url string) (stores.Store, string, error)

// StoreOpener is OpenStore over stores.Open; S3 credentials come from the
// STORAGE_S3_* environment (stores.Options' defaults).
func StoreOpener(opts stores.Options) OpenStore {
	return func(ctx context.Context, url string) (stores.Store, string, error) {
		return stores.Open(ctx, url, opts)
	}
}

// found is a snapshot accepted as a Checkpoint's.
type found struct {
	desc          ocispec.Descriptor
	storedBytes   int64
	uploadedBytes int64
	pauseWindow   string
}

// errNotOurs: the tag names no snapshot, or one that is not the
// Checkpoint's (another pod, an older one). The message says which.
var errNotOurs = errors.New("no snapshot of this checkpoint")

// want is what a Checkpoint's snapshot must be.
type want struct {
	namespace string
	podUID    string
	notBefore time.Time // the request's start minus the clock skew
	prior     string    // the tag's digest before the kubelet was asked
}

// lookup resolves tag in store and returns its snapshot if it is the one
// want describes; errNotOurs (wrapped, with the reason) if it is not; other
// errors are the store's.
func lookup(ctx context.Context, store stores.Store, tag string, w want) (found, error) {
	snap, err := snapshot.Open(ctx, store, tag, snapshot.ReadOptions{Tenant: w.namespace})
	switch {
	case errdefs.IsNotFound(err):
		return found{}, fmt.Errorf("tag %s not in the store: %w", tag, errNotOurs)
	case err != nil && !transientStore(err):
		// Not a cryo snapshot, or one this reader refuses: never recorded.
		return found{}, fmt.Errorf("tag %s: %v: %w", tag, err, errNotOurs)
	case err != nil:
		return found{}, err
	}
	md := snap.Metadata
	switch {
	case md.Source.PodUID != w.podUID:
		return found{}, fmt.Errorf("tag %s names a snapshot of pod UID %q, not %s: %w", tag, md.Source.PodUID, w.podUID, errNotOurs)
	case snap.Descriptor.Digest.String() == w.prior:
		return found{}, fmt.Errorf("tag %s still names %s, the snapshot from before this checkpoint: %w", tag, w.prior, errNotOurs)
	case md.Created.Before(w.notBefore):
		return found{}, fmt.Errorf("tag %s names a snapshot created %s, before this checkpoint started: %w", tag, md.Created.Format(time.RFC3339), errNotOurs)
	}
	f := found{desc: snap.Descriptor}
	for _, l := range snap.Manifest.Layers {
		f.storedBytes += l.Size
	}
	ann := map[string]string{}
	for k, v := range md.Annotations {
		ann[k] = v
	}
	for k, v := range snap.Manifest.Annotations {
		ann[k] = v
	}
	if n, err := strconv.ParseInt(ann[AnnotationUploadedBytes], 10, 64); err == nil && n >= 0 {
		f.uploadedBytes = n
	}
	if d, err := time.ParseDuration(ann[AnnotationPauseWindow]); err == nil && d >= 0 {
		f.pauseWindow = d.String()
	}
	return f, nil
}

// currentDigest is the digest the tag names now, "" if none.
func currentDigest(ctx context.Context, store stores.Store, tag string) (string, error) {
	desc, err := store.Resolve(ctx, tag)
	if errdefs.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return desc.Digest.String(), nil
}

// transientStore says whether a store error is worth retrying (the store
// already retried it a few times): anything but a refusal of the request.
func transientStore(err error) bool {
	return !(errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) || errdefs.IsPermissionDenied(err) ||
		errdefs.IsUnauthorized(err) || errdefs.IsNotImplemented(err) || errdefs.IsFailedPrecondition(err) ||
		errdefs.IsDataLoss(err) || errors.Is(err, context.Canceled))
}
