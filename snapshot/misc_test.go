package snapshot

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/cryo-runtime/cryo/nodecache"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "enc.key")
	if err := GenerateEncryptionKey(p); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v", st.Mode().Perm())
	}
	k, err := LoadEncryptionKey(p)
	if err != nil || len(k) != 32 {
		t.Fatalf("load: %d bytes, %v", len(k), err)
	}
	hx := filepath.Join(dir, "hex.key")
	os.WriteFile(hx, []byte(hex.EncodeToString(k)+"\n"), 0o600)
	if k2, err := LoadEncryptionKey(hx); err != nil || !bytes.Equal(k, k2) {
		t.Errorf("hex key: %v", err)
	}
	short := filepath.Join(dir, "short.key")
	os.WriteFile(short, []byte("too short"), 0o600)
	if _, err := LoadEncryptionKey(short); !errdefs.IsInvalidArgument(err) {
		t.Errorf("short key: %v", err)
	}
	if _, err := LoadSigningKey(p); !errdefs.IsInvalidArgument(err) {
		t.Errorf("signing key from a raw file: %v", err)
	}
	if err := GenerateEncryptionKey(p); err == nil {
		t.Error("overwrote an existing key")
	}
}

// Two encrypted chunks swapped in the manifest (with correct digests) fail
// to decrypt: the AAD binds each chunk to its file and offset.
func TestEncryptedChunksCannotMove(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	key := bytes.Repeat([]byte{9}, 32)
	ts.write(t, store, "v1", WriteOptions{EncryptionKey: key})
	rewrite(t, store, "v1", func(m *ocispec.Manifest, _ *Metadata) {
		i := firstLayer(t, m, "disk:root")
		m.Layers[i].Digest, m.Layers[i+1].Digest = m.Layers[i+1].Digest, m.Layers[i].Digest
		m.Layers[i].Size, m.Layers[i+1].Size = m.Layers[i+1].Size, m.Layers[i].Size
	})
	s := open(t, store, "v1", ReadOptions{DecryptionKey: key})
	cache := t.TempDir()
	if _, err := s.Materialize(context.Background(), nodecache.OpenSnapshots(cache)); !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "decrypt") {
		t.Fatalf("swapped chunks: %v", err)
	}
	assertEmptyCache(t, cache)
}

// failingStore fails the n-th push.
type failingStore struct {
	*memStore
	n, pushes int
}

func (f *failingStore) Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	f.pushes++
	if f.pushes == f.n {
		return fmt.Errorf("push: %w", errdefs.ErrUnavailable)
	}
	return f.memStore.Push(ctx, desc, r)
}

func TestWriteFailureTagsNothing(t *testing.T) {
	ts := newTestSnap(t)
	for _, n := range []int{1, 20, 38} { // a chunk, a later chunk, the manifest
		store := &failingStore{memStore: newMemStore(), n: n}
		src, err := NewSource(ts.md, ts.paths)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = Write(context.Background(), store, "v1", src, WriteOptions{ChunkSize: testCS, Uploads: 1})
		src.Close()
		if !errdefs.IsUnavailable(err) {
			t.Errorf("push %d fails: write returned %v", n, err)
		}
		if tags, _ := store.Tags(context.Background()); len(tags) != 0 {
			t.Errorf("push %d fails: tags %v", n, tags)
		}
	}
}

func TestWriteRefusesBadInput(t *testing.T) {
	ts := newTestSnap(t)
	ctx := context.Background()
	src, err := NewSource(ts.md, ts.paths)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for name, opts := range map[string]WriteOptions{
		"chunk size not a power of two": {ChunkSize: 3 << 20},
		"chunk size too small":          {ChunkSize: 4096},
		"short key":                     {ChunkSize: testCS, EncryptionKey: []byte("short")},
	} {
		if _, _, err := Write(ctx, newMemStore(), "v1", src, opts); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, _, err := Write(ctx, newMemStore(), "v1@sha256:"+strings.Repeat("0", 64), src, WriteOptions{ChunkSize: testCS}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("digest ref: %v", err)
	}
	bad := &Source{Files: []SourceFile{BytesSourceFile("disk:../x", []byte("x"))}}
	if _, _, err := Write(ctx, newMemStore(), "v1", bad, WriteOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad file name: %v", err)
	}
	dup := &Source{Files: []SourceFile{BytesSourceFile(FileSpec, []byte("x")), BytesSourceFile(FileSpec, []byte("y"))}}
	if _, _, err := Write(ctx, newMemStore(), "v1", dup, WriteOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("duplicate file: %v", err)
	}
	if _, err := NewSource(Metadata{}, SourcePaths{RAM: "/nonexistent/ram"}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing RAM file: %v", err)
	}
}

func TestOpenRefs(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	ts.md.Source.PodName = "other"
	ts.write(t, store, "v2", WriteOptions{})
	ctx := context.Background()
	d1, _ := store.Resolve(ctx, "v1")
	if s := open(t, store, "v2@"+d1.Digest.String(), ReadOptions{}); s.Descriptor.Digest != d1.Digest {
		t.Errorf("pinned digest did not win over the tag")
	}
	// A store that cannot resolve digests: the tag must name the pin.
	nod := &noDigestResolve{newMemStore()}
	nod.memStore = store
	if _, err := Open(ctx, nod, "v2@"+d1.Digest.String(), ReadOptions{}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("tag names another manifest than the pin: %v", err)
	}
	if s, err := Open(ctx, nod, "v1@"+d1.Digest.String(), ReadOptions{}); err != nil || s.Descriptor.Digest != d1.Digest {
		t.Errorf("tag names the pin: %v", err)
	}
	for _, ref := range []string{"", "v1@sha256:abc", "v1@md5:" + strings.Repeat("0", 32), "v1@0123"} {
		if _, err := Open(ctx, store, ref, ReadOptions{}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ref %q: %v", ref, err)
		}
	}
	if _, err := Open(ctx, store, "missing", ReadOptions{}); !errdefs.IsNotFound(err) {
		t.Errorf("missing tag: %v", err)
	}
}

type noDigestResolve struct{ *memStore }

func (n *noDigestResolve) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	if strings.HasPrefix(ref, "sha256:") {
		return ocispec.Descriptor{}, errdefs.ErrNotFound
	}
	return n.memStore.Resolve(ctx, ref)
}

// TestMaterializeCancel cancels a materialization midway: nothing is left.
func TestMaterializeCancel(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	s := open(t, store, "v1", ReadOptions{Workers: 1})
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	s.writeAt = func(f writerAt, b []byte, off int64) (int, error) {
		if n++; n == 3 {
			cancel()
		}
		return f.WriteAt(b, off)
	}
	cache := t.TempDir()
	if _, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled materialize: %v", err)
	}
	assertEmptyCache(t, cache)
}

func TestExpiry(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.md.Expires = time.Now().Add(-time.Minute)
	ts.write(t, store, "old", WriteOptions{})
	ts.md.Expires = time.Now().Add(time.Hour)
	ts.write(t, store, "new", WriteOptions{})
	ctx := context.Background()
	if _, err := Open(ctx, store, "old", ReadOptions{RefuseExpired: true}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("expired: %v", err)
	}
	if s := open(t, store, "old", ReadOptions{}); !s.Metadata.Expired(time.Now()) {
		t.Error("Expired() false")
	}
	open(t, store, "new", ReadOptions{RefuseExpired: true})
}
