package stores

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/flock"
	"github.com/cryo-runtime/cryo/internal/safefs"
)

// fileStore is an OCI image layout directory (index.json, oci-layout,
// blobs/sha256/<hex>), usable on local disk, NFS and CSI mounts. Blobs are
// written 0600 to ingest/ and renamed into place after their digest is
// checked; index.json is replaced atomically under an flock, so a tag is the
// last thing a publish changes.
//
// Others may write the directory (a shared store, a checkpoint directory
// containerd extracted from an image): no symlink is followed, neither in
// the root's path nor under it, and a FIFO, socket or device where a file
// should be is refused at once (safefs).
type fileStore struct {
	root string
	dir  *safefs.Dir // root
	mu   sync.Mutex  // serializes index.json updates within this process
}

var (
	_ Store   = (*fileStore)(nil)
	_ GCStore = (*fileStore)(nil)
)

// NewFileStore opens (creating if needed) the OCI image layout at root.
func NewFileStore(root string) (Store, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("file store %q: path must be absolute: %w", root, errdefs.ErrInvalidArgument)
	}
	root = filepath.Clean(root)
	dir, err := safefs.MkdirAllNoFollow(root)
	if err != nil {
		return nil, fmt.Errorf("file store %s (name it by a path without symlinks): %w", root, err)
	}
	for _, d := range []string{"blobs/sha256", "ingest"} {
		sub, err := dir.MkdirAll(d, 0o700)
		if err != nil {
			dir.Close()
			return nil, fmt.Errorf("file store %s: %w", root, err)
		}
		sub.Close()
	}
	if _, err := dir.Lstat(ocispec.ImageLayoutFile); errors.Is(err, fs.ErrNotExist) {
		b, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
		if err := writeFileAtomic(dir, ocispec.ImageLayoutFile, b); err != nil {
			dir.Close()
			return nil, fmt.Errorf("file store %s: %w", root, err)
		}
	}
	return &fileStore{root: root, dir: dir}, nil
}

// blobName is the blob's name under the root, blobs/<alg>/<hex>, from a
// validated digest.
func (f *fileStore) blobName(d digest.Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", fmt.Errorf("digest %q: %w: %w", d, err, errdefs.ErrInvalidArgument)
	}
	return "blobs/" + d.Algorithm().String() + "/" + d.Encoded(), nil
}

func (f *fileStore) Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error) {
	p, err := f.blobName(desc.Digest)
	if err != nil {
		return false, err
	}
	st, err := f.dir.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat blob %s: %w", desc.Digest, err)
	}
	if !st.Mode().IsRegular() {
		return false, fmt.Errorf("blob %s in %s is a %v, not a regular file: %w: %w", desc.Digest, f.root, st.Mode().Type(), safefs.ErrUnsafe, errdefs.ErrInvalidArgument)
	}
	return desc.Size <= 0 || st.Size() == desc.Size, nil
}

func (f *fileStore) Fetch(ctx context.Context, desc ocispec.Descriptor, offset, length int64) (io.ReadCloser, error) {
	p, err := f.blobName(desc.Digest)
	if err != nil {
		return nil, err
	}
	fh, err := f.dir.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("open blob %s: %w", desc.Digest, err)
	}
	// A blob of another size than its descriptor's (cut short, say) is
	// lost, not a read to retry.
	if st, err := fh.Stat(); err != nil {
		fh.Close()
		return nil, fmt.Errorf("stat blob %s: %w", desc.Digest, err)
	} else if desc.Size > 0 && st.Size() != desc.Size {
		fh.Close()
		return nil, fmt.Errorf("blob %s in %s: %d bytes, descriptor says %d: %w", desc.Digest, f.root, st.Size(), desc.Size, errdefs.ErrDataLoss)
	}
	if length < 0 {
		length = 1<<63 - 1 - offset
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(fh, offset, length), fh}, nil
}

func (f *fileStore) Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	if ok, err := f.Exists(ctx, desc); err != nil || ok {
		return err
	}
	if _, err := f.blobName(desc.Digest); err != nil {
		return err
	}
	if err := f.ingestFile(ctx, desc, r); err != nil {
		return fmt.Errorf("push %s to %s: %w", desc.Digest, f.root, err)
	}
	return nil
}

// ingestFile copies r into a 0600 temp file in ingest/, hashing it, and
// renames it into blobs/ only when digest and size match desc.
func (f *fileStore) ingestFile(ctx context.Context, desc ocispec.Descriptor, r io.Reader) (retErr error) {
	ingest, err := f.dir.Sub("ingest")
	if err != nil {
		return err
	}
	defer ingest.Close()
	blobs, err := f.dir.MkdirAll("blobs/"+desc.Digest.Algorithm().String(), 0o700)
	if err != nil {
		return err
	}
	defer blobs.Close()
	name := ".ingest-" + randomSuffix()
	tmp, err := ingest.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			tmp.Close()
			ingest.Remove(name)
		}
	}()
	v := desc.Digest.Verifier()
	n, err := io.Copy(io.MultiWriter(tmp, v), ctxReader{ctx, r})
	if err != nil {
		return err
	}
	if desc.Size > 0 && n != desc.Size {
		return fmt.Errorf("size %d, descriptor says %d: %w", n, desc.Size, errdefs.ErrDataLoss)
	}
	if !v.Verified() {
		return fmt.Errorf("content does not match digest %s: %w", desc.Digest, errdefs.ErrDataLoss)
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := ingest.Rename(name, blobs, desc.Digest.Encoded()); err != nil {
		return err
	}
	return blobs.Sync()
}

func randomSuffix() string {
	var rnd [6]byte
	rand.Read(rnd[:])
	return hex.EncodeToString(rnd[:])
}

// ContextReader returns r as a reader that stops a copy once ctx is
// cancelled.
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return ctxReader{ctx, r} }

// ctxReader stops a copy when its context is cancelled.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func (f *fileStore) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	if d, ok := isDigestRef(ref); ok {
		return f.resolveDigest(ctx, d)
	}
	idx, err := f.readIndex()
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	for _, m := range idx.Manifests {
		if m.Annotations[ocispec.AnnotationRefName] == ref {
			return m, nil
		}
	}
	return ocispec.Descriptor{}, fmt.Errorf("reference %q in %s: %w", ref, f.root, errdefs.ErrNotFound)
}

// resolveDigest builds the descriptor of a manifest named by digest: from
// index.json when it is listed there, else from the blob itself.
func (f *fileStore) resolveDigest(ctx context.Context, d digest.Digest) (ocispec.Descriptor, error) {
	if idx, err := f.readIndex(); err == nil {
		for _, m := range idx.Manifests {
			if m.Digest == d {
				m.Annotations = nil
				return m, nil
			}
		}
	}
	p, err := f.blobName(d)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	b, err := f.dir.ReadFile(p, maxManifestSize)
	if errors.Is(err, fs.ErrNotExist) {
		return ocispec.Descriptor{}, fmt.Errorf("manifest %s in %s: %w", d, f.root, errdefs.ErrNotFound)
	}
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("read manifest %s: %w", d, err)
	}
	return manifestDescriptor(d, b), nil
}

func (f *fileStore) Tag(ctx context.Context, desc ocispec.Descriptor, ref string) error {
	if err := validTag(ref); err != nil {
		return err
	}
	if ok, err := f.Exists(ctx, desc); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("tag %s: manifest %s is not in the store: %w", ref, desc.Digest, errdefs.ErrFailedPrecondition)
	}
	return f.updateIndex(ctx, func(idx *ocispec.Index) error {
		desc.Annotations = map[string]string{ocispec.AnnotationRefName: ref}
		idx.Manifests = slices.DeleteFunc(idx.Manifests, func(m ocispec.Descriptor) bool {
			return m.Annotations[ocispec.AnnotationRefName] == ref
		})
		idx.Manifests = append(idx.Manifests, desc)
		return nil
	})
}

func (f *fileStore) Tags(ctx context.Context) ([]string, error) {
	idx, err := f.readIndex()
	if err != nil {
		return nil, err
	}
	return indexTags(idx), nil
}

// indexTags returns the sorted tags of an OCI layout's index (the
// org.opencontainers.image.ref.name of its manifests).
func indexTags(idx *ocispec.Index) []string {
	var tags []string
	for _, m := range idx.Manifests {
		if t := m.Annotations[ocispec.AnnotationRefName]; t != "" {
			tags = append(tags, t)
		}
	}
	slices.Sort(tags)
	return tags
}

func (f *fileStore) Untag(ctx context.Context, ref string) error {
	return f.updateIndex(ctx, func(idx *ocispec.Index) error {
		n := len(idx.Manifests)
		idx.Manifests = slices.DeleteFunc(idx.Manifests, func(m ocispec.Descriptor) bool {
			return m.Annotations[ocispec.AnnotationRefName] == ref
		})
		if len(idx.Manifests) == n {
			return fmt.Errorf("reference %q in %s: %w", ref, f.root, errdefs.ErrNotFound)
		}
		return nil
	})
}

// Roots returns the manifests index.json lists.
func (f *fileStore) Roots(ctx context.Context) ([]ocispec.Descriptor, error) {
	idx, err := f.readIndex()
	if err != nil {
		return nil, err
	}
	return idx.Manifests, nil
}

func (f *fileStore) Blobs(ctx context.Context, fn func(BlobInfo) error) error {
	dir, err := f.dir.Sub("blobs/sha256")
	if err != nil {
		return fmt.Errorf("list blobs in %s: %w", f.root, err)
	}
	defer dir.Close()
	ents, err := dir.ReadDir()
	if err != nil {
		return fmt.Errorf("list blobs in %s: %w", f.root, err)
	}
	for _, e := range ents {
		d := digest.NewDigestFromEncoded(digest.SHA256, e.Name())
		if d.Validate() != nil || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		if err := fn(BlobInfo{Digest: d, Size: info.Size(), ModTime: info.ModTime()}); err != nil {
			return err
		}
	}
	return nil
}

func (f *fileStore) Delete(ctx context.Context, d digest.Digest) error {
	if _, err := f.blobName(d); err != nil {
		return err
	}
	dir, err := f.dir.Sub("blobs/" + d.Algorithm().String())
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob %s: %w", d, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("delete blob %s: %w", d, err)
	}
	defer dir.Close()
	if err := dir.Remove(d.Encoded()); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("blob %s: %w", d, errdefs.ErrNotFound)
		}
		return fmt.Errorf("delete blob %s: %w", d, err)
	}
	return nil
}

func (f *fileStore) readIndex() (*ocispec.Index, error) {
	b, err := f.dir.ReadFile(ocispec.ImageIndexFile, maxManifestSize)
	if errors.Is(err, fs.ErrNotExist) {
		return &ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read index of %s: %w", f.root, err)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("parse index of %s: %w: %w", f.root, err, errdefs.ErrDataLoss)
	}
	return &idx, nil
}

// indexLockWait bounds the wait for the index lock: another writer holds it
// for a moment, a stuck or hostile one (the store may be shared) for ever.
const indexLockWait = 30 * time.Second

// updateIndex applies fn to index.json under an exclusive flock (other
// processes, NFS permitting) and the store mutex, and replaces it atomically.
func (f *fileStore) updateIndex(ctx context.Context, fn func(*ocispec.Index) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	lock, err := f.dir.OpenFile("ingest/.index.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("lock index of %s: %w", f.root, err)
	}
	defer lock.Close()
	lctx, cancel := context.WithTimeout(ctx, indexLockWait)
	err = flock.Wait(lctx, lock, unix.LOCK_EX)
	cancel()
	if err != nil {
		return fmt.Errorf("lock index of %s: %w", f.root, err)
	}
	idx, err := f.readIndex()
	if err != nil {
		return err
	}
	if err := fn(idx); err != nil {
		return err
	}
	if idx.Manifests == nil {
		idx.Manifests = []ocispec.Descriptor{}
	}
	b, err := json.Marshal(idx)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(f.dir, ocispec.ImageIndexFile, b); err != nil {
		return fmt.Errorf("write index of %s: %w", f.root, err)
	}
	return nil
}

// writeFileAtomic writes b to a 0600 temp file beside name in dir, syncs
// and renames it.
func writeFileAtomic(dir *safefs.Dir, name string, b []byte) (retErr error) {
	tmp := name + ".tmp-" + randomSuffix()
	fh, err := dir.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			fh.Close()
			dir.Remove(tmp)
		}
	}()
	if _, err := fh.Write(b); err != nil {
		return err
	}
	if err := fh.Sync(); err != nil {
		return err
	}
	if err := fh.Close(); err != nil {
		return err
	}
	if err := dir.Rename(tmp, dir, name); err != nil {
		return err
	}
	return dir.Sync()
}

// maxManifestSize bounds the JSON documents (index, manifests, references)
// read whole into memory.
const maxManifestSize = 4 << 20

func readLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("document larger than %d bytes: %w", limit, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// manifestDescriptor describes the manifest bytes b stored under d, taking
// the media type from the document (default: OCI image manifest).
func manifestDescriptor(d digest.Digest, b []byte) ocispec.Descriptor {
	var m struct {
		MediaType    string `json:"mediaType"`
		ArtifactType string `json:"artifactType"`
	}
	_ = json.Unmarshal(b, &m)
	if m.MediaType == "" {
		m.MediaType = ocispec.MediaTypeImageManifest
	}
	return ocispec.Descriptor{MediaType: m.MediaType, ArtifactType: m.ArtifactType, Digest: d, Size: int64(len(b))}
}

// BlobInfo describes a stored blob for garbage collection.
type BlobInfo struct {
	Digest  digest.Digest
	Size    int64
	ModTime time.Time
}
