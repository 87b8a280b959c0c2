package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/stores"
)

// memStore is an in-memory stores.Store for this package's unit tests. Its
// hooks let a test play a hostile store.
type memStore struct {
	mu    sync.Mutex
	blobs map[digest.Digest][]byte
	tags  map[string]ocispec.Descriptor

	// fetchHook, when set, may replace the bytes a Fetch returns.
	fetchHook func(desc ocispec.Descriptor, off, length int64, b []byte) []byte

	fetches, pushes atomic.Int64
	pushedBytes     atomic.Int64
	verifyPushes    bool
}

var _ stores.Store = (*memStore)(nil)

func newMemStore() *memStore {
	return &memStore{blobs: map[digest.Digest][]byte{}, tags: map[string]ocispec.Descriptor{}, verifyPushes: true}
}

func (m *memStore) Exists(_ context.Context, desc ocispec.Descriptor) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.blobs[desc.Digest]
	return ok, nil
}

func (m *memStore) Fetch(_ context.Context, desc ocispec.Descriptor, off, length int64) (io.ReadCloser, error) {
	m.fetches.Add(1)
	m.mu.Lock()
	b, ok := m.blobs[desc.Digest]
	hook := m.fetchHook
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, errdefs.ErrNotFound)
	}
	if off > int64(len(b)) {
		return nil, fmt.Errorf("offset %d: %w", off, errdefs.ErrOutOfRange)
	}
	end := int64(len(b))
	if length >= 0 && off+length < end {
		end = off + length
	}
	out := b[off:end:end] // blobs are never modified in place (see corrupt)
	if hook != nil {
		out = hook(desc, off, length, append([]byte(nil), out...))
	}
	return io.NopCloser(bytes.NewReader(out)), nil
}

func (m *memStore) Push(_ context.Context, desc ocispec.Descriptor, r io.Reader) error {
	m.mu.Lock()
	_, ok := m.blobs[desc.Digest]
	m.mu.Unlock()
	if ok {
		return nil
	}
	b := make([]byte, desc.Size)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	if n, _ := r.Read(make([]byte, 1)); n > 0 {
		return fmt.Errorf("push %s: more than %d bytes: %w", desc.Digest, desc.Size, errdefs.ErrInvalidArgument)
	}
	if m.verifyPushes && (digest.FromBytes(b) != desc.Digest || int64(len(b)) != desc.Size) {
		return fmt.Errorf("push %s: content mismatch: %w", desc.Digest, errdefs.ErrInvalidArgument)
	}
	m.pushes.Add(1)
	m.pushedBytes.Add(int64(len(b)))
	m.mu.Lock()
	m.blobs[desc.Digest] = b
	m.mu.Unlock()
	return nil
}

func (m *memStore) Resolve(_ context.Context, ref string) (ocispec.Descriptor, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if strings.HasPrefix(ref, "sha256:") {
		if b, ok := m.blobs[digest.Digest(ref)]; ok {
			return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.Digest(ref), Size: int64(len(b))}, nil
		}
		return ocispec.Descriptor{}, fmt.Errorf("%s: %w", ref, errdefs.ErrNotFound)
	}
	d, ok := m.tags[ref]
	if !ok {
		return ocispec.Descriptor{}, fmt.Errorf("tag %s: %w", ref, errdefs.ErrNotFound)
	}
	return d, nil
}

func (m *memStore) Tag(_ context.Context, desc ocispec.Descriptor, ref string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.blobs[desc.Digest]; !ok {
		return fmt.Errorf("tag %s: manifest %s missing: %w", ref, desc.Digest, errdefs.ErrFailedPrecondition)
	}
	m.tags[ref] = desc
	return nil
}

func (m *memStore) Tags(context.Context) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for t := range m.tags {
		out = append(out, t)
	}
	sort.Strings(out)
	return out, nil
}

func (m *memStore) Untag(_ context.Context, ref string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.tags, ref)
	return nil
}

// put stores b under its digest, bypassing Push (for crafted blobs).
func (m *memStore) put(b []byte) ocispec.Descriptor {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := digest.FromBytes(b)
	m.blobs[d] = b
	return ocispec.Descriptor{Digest: d, Size: int64(len(b))}
}

// corrupt replaces the stored content of d (keeping its name).
func (m *memStore) corrupt(d digest.Digest, fn func([]byte) []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.blobs[d] = fn(append([]byte(nil), m.blobs[d]...))
}

func (m *memStore) get(d digest.Digest) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.blobs[d]
}
