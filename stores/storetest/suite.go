package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/stores"
)

// Blob is test content with its descriptor.
type Blob struct {
	Desc ocispec.Descriptor
	Data []byte
}

// NewBlob describes data with mediaType.
func NewBlob(mediaType string, data []byte) Blob {
	return Blob{Desc: ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}, Data: data}
}

// RandomBytes returns n deterministic pseudo-random bytes.
func RandomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// Fixture is a small artifact pushed by Seed.
type Fixture struct {
	Tag      string
	Manifest Blob
	Config   Blob
	Layers   []Blob
}

// All returns every blob of the fixture, manifest last.
func (f Fixture) All() []Blob {
	return append(append([]Blob{f.Config}, f.Layers...), f.Manifest)
}

// NewFixture builds an artifact with a config and two layers (one of 3 MiB
// + 17 bytes, so ranged reads cross several buffers).
func NewFixture(tag string, seed uint64) Fixture {
	cfg := NewBlob("application/vnd.cryo.test.config.v1+json", []byte(`{"test":true,"seed":`+string(rune('0'+seed%10))+`}`))
	l1 := NewBlob("application/vnd.cryo.test.chunk.v1", RandomBytes(seed, 3<<20+17))
	l2 := NewBlob("application/vnd.cryo.test.chunk.v1", RandomBytes(seed+1, 4096))
	m := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: "application/vnd.cryo.test.v1",
		Config:       cfg.Desc,
		Layers:       []ocispec.Descriptor{l1.Desc, l2.Desc},
	}
	mb, _ := json.Marshal(m)
	return Fixture{Tag: tag, Manifest: NewBlob(ocispec.MediaTypeImageManifest, mb), Config: cfg, Layers: []Blob{l1, l2}}
}

// Seed pushes f into s (blobs first, tag last).
func Seed(t testing.TB, s stores.Store, f Fixture) {
	t.Helper()
	ctx := context.Background()
	for _, b := range f.All() {
		if err := s.Push(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
			t.Fatalf("push %s: %v", b.Desc.Digest, err)
		}
	}
	if err := s.Tag(ctx, f.Manifest.Desc, f.Tag); err != nil {
		t.Fatalf("tag %s: %v", f.Tag, err)
	}
}

// ReadAll fetches a range and returns the bytes.
func ReadAll(t testing.TB, s stores.Store, d ocispec.Descriptor, off, n int64) []byte {
	t.Helper()
	rc, err := s.Fetch(context.Background(), d, off, n)
	if err != nil {
		t.Fatalf("fetch %s [%d,+%d): %v", d.Digest, off, n, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s [%d,+%d): %v", d.Digest, off, n, err)
	}
	return b
}

// CheckRead checks every read operation of s against fixture f already in s.
func CheckRead(t *testing.T, s stores.Store, f Fixture) {
	ctx := context.Background()
	t.Run("resolve", func(t *testing.T) {
		d, err := s.Resolve(ctx, f.Tag)
		if err != nil {
			t.Fatal(err)
		}
		if d.Digest != f.Manifest.Desc.Digest || d.Size != f.Manifest.Desc.Size || d.MediaType != ocispec.MediaTypeImageManifest {
			t.Fatalf("resolve %s = %+v, want %+v", f.Tag, d, f.Manifest.Desc)
		}
		d, err = s.Resolve(ctx, f.Manifest.Desc.Digest.String())
		if err != nil || d.Digest != f.Manifest.Desc.Digest || d.Size != f.Manifest.Desc.Size {
			t.Fatalf("resolve by digest = %+v, %v", d, err)
		}
		if _, err := s.Resolve(ctx, "no-such-tag"); !errdefs.IsNotFound(err) {
			t.Fatalf("resolve missing tag: %v, want not found", err)
		}
	})
	t.Run("tags", func(t *testing.T) {
		tags, err := s.Tags(ctx)
		if err != nil || !slices.Contains(tags, f.Tag) {
			t.Fatalf("tags = %v, %v; want %s in it", tags, err, f.Tag)
		}
	})
	t.Run("exists", func(t *testing.T) {
		for _, b := range f.All() {
			if ok, err := s.Exists(ctx, b.Desc); err != nil || !ok {
				t.Fatalf("exists %s = %v, %v", b.Desc.Digest, ok, err)
			}
		}
		missing := NewBlob("application/octet-stream", []byte("not there"))
		if ok, err := s.Exists(ctx, missing.Desc); err != nil || ok {
			t.Fatalf("exists missing = %v, %v", ok, err)
		}
	})
	t.Run("fetch", func(t *testing.T) {
		for _, b := range f.All() {
			if got := ReadAll(t, s, b.Desc, 0, -1); !bytes.Equal(got, b.Data) {
				t.Fatalf("fetch %s: %d bytes differ from the %d pushed", b.Desc.Digest, len(got), len(b.Data))
			}
		}
		big := f.Layers[0]
		n := int64(len(big.Data))
		for _, r := range [][2]int64{{0, 1}, {1, 100}, {1 << 20, 1 << 20}, {n - 17, 17}, {n - 5, -1}, {12345, -1}, {n, 0}} {
			want := big.Data[r[0]:]
			if r[1] >= 0 {
				want = want[:r[1]]
			}
			if got := ReadAll(t, s, big.Desc, r[0], r[1]); !bytes.Equal(got, want) {
				t.Fatalf("fetch range %v: got %d bytes, want %d (content differs: %v)", r, len(got), len(want), len(got) == len(want))
			}
		}
		missing := NewBlob("application/octet-stream", []byte("not there"))
		if rc, err := s.Fetch(ctx, missing.Desc, 0, -1); !errdefs.IsNotFound(err) {
			if rc != nil {
				rc.Close()
			}
			t.Fatalf("fetch missing: %v, want not found", err)
		}
	})
}

// failReader fails the test's expectations when read.
type failReader struct{ read *bool }

func (f failReader) Read([]byte) (int, error) {
	*f.read = true
	return 0, errors.New("must not be read")
}

// RunStoreSuite runs the conformance checks of a writable store; s must be
// empty for the tag "v1".
func RunStoreSuite(t *testing.T, s stores.Store) {
	ctx := context.Background()
	f := NewFixture("v1", 1)
	Seed(t, s, f)
	CheckRead(t, s, f)
	t.Run("push-existing-does-not-read", func(t *testing.T) {
		read := false
		if err := s.Push(ctx, f.Layers[0].Desc, failReader{&read}); err != nil || read {
			t.Fatalf("push of an existing blob: err %v, read %v", err, read)
		}
	})
	t.Run("push-wrong-content-refused", func(t *testing.T) {
		good := NewBlob("application/vnd.cryo.test.chunk.v1", RandomBytes(99, 1000))
		bad := bytes.Clone(good.Data)
		bad[500] ^= 1
		if err := s.Push(ctx, good.Desc, bytes.NewReader(bad)); err == nil {
			t.Fatal("push of content not matching its digest succeeded")
		}
		if ok, _ := s.Exists(ctx, good.Desc); ok {
			t.Fatal("a refused push left the blob in the store")
		}
	})
	t.Run("tag-missing-manifest-refused", func(t *testing.T) {
		m := NewBlob(ocispec.MediaTypeImageManifest, []byte(`{"schemaVersion":2}`))
		if err := s.Tag(ctx, m.Desc, "dangling"); err == nil {
			t.Fatal("tagging a manifest that is not in the store succeeded")
		}
	})
	t.Run("retag-and-untag", func(t *testing.T) {
		g := NewFixture("v2", 2)
		Seed(t, s, g)
		if d, err := s.Resolve(ctx, "v2"); err != nil || d.Digest != g.Manifest.Desc.Digest {
			t.Fatalf("resolve v2 = %v, %v", d.Digest, err)
		}
		// Move v2 to f's manifest: the reference changes atomically.
		if err := s.Tag(ctx, f.Manifest.Desc, "v2"); err != nil {
			t.Fatal(err)
		}
		if d, err := s.Resolve(ctx, "v2"); err != nil || d.Digest != f.Manifest.Desc.Digest {
			t.Fatalf("resolve moved v2 = %v, %v", d.Digest, err)
		}
		if err := s.Untag(ctx, "v2"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Resolve(ctx, "v2"); !errdefs.IsNotFound(err) {
			t.Fatalf("resolve after untag: %v, want not found", err)
		}
		if err := s.Untag(ctx, "never-was"); !errdefs.IsNotFound(err) {
			t.Fatalf("untag missing: %v, want not found", err)
		}
	})
}

// CheckReadOnly checks that writes to a read-only store fail clearly.
func CheckReadOnly(t *testing.T, s stores.Store, f Fixture) {
	ctx := context.Background()
	b := NewBlob("application/octet-stream", []byte("new"))
	if err := s.Push(ctx, b.Desc, bytes.NewReader(b.Data)); !errdefs.IsNotImplemented(err) {
		t.Errorf("push: %v, want not implemented", err)
	}
	if err := s.Tag(ctx, f.Manifest.Desc, "x"); !errdefs.IsNotImplemented(err) {
		t.Errorf("tag: %v, want not implemented", err)
	}
	if err := s.Untag(ctx, f.Tag); !errdefs.IsNotImplemented(err) {
		t.Errorf("untag: %v, want not implemented", err)
	}
}
