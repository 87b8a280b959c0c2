package snapshot

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/internal/bootid"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
)

// rewriteMarker replaces (or, with marker nil, removes) the completion
// marker of the materialized directory dir.
func rewriteMarker(t *testing.T, dir string, marker []byte) {
	t.Helper()
	p := filepath.Join(dir, nodecache.CompleteFile)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if marker != nil {
		if err := os.WriteFile(p, marker, 0o400); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMaterializeBootMarker: a directory is used only when its completion
// marker names this snapshot and this boot; any other is removed and
// materialized again (nothing is fsynced, so after a machine crash it may
// be torn).
func TestMaterializeBootMarker(t *testing.T) {
	boot, err := bootid.Get()
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	s := open(t, store, "v1", ReadOptions{})
	cache := t.TempDir()
	ctx := context.Background()
	m, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(m.Dir, nodecache.CompleteFile))
	if err != nil || !strings.Contains(string(b), "boot "+boot+"\n") || !strings.Contains(string(b), s.Descriptor.Digest.String()) {
		t.Fatalf("marker %q, %v", b, err)
	}

	other := bytes.Replace(b, []byte(boot), []byte("00000000-0000-0000-0000-000000000000"), 1)
	for _, tc := range []struct {
		name   string
		marker []byte
		tear   bool
	}{
		{"another boot", other, false},
		{"another boot, torn", other, true},
		{"no marker", nil, false},
		{"another snapshot", bytes.Replace(b, []byte(s.Descriptor.Digest.Encoded()), []byte(strings.Repeat("0", 64)), 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rewriteMarker(t, m.Dir, tc.marker)
			if tc.tear {
				// What writeback had not reached the disk reads as zeros.
				if err := os.Chmod(m.RAM, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(m.RAM, 0); err != nil {
					t.Fatal(err)
				}
			}
			before := store.fetches.Load()
			m2, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache))
			if err != nil {
				t.Fatal(err)
			}
			if m2.CacheHit || m2.Dir != m.Dir || store.fetches.Load() == before {
				t.Fatalf("stale directory used: hit %v, dir %s, %d fetches", m2.CacheHit, m2.Dir, store.fetches.Load()-before)
			}
			ts.checkFiles(t, m2)
			if got, err := os.ReadFile(filepath.Join(m2.Dir, nodecache.CompleteFile)); err != nil || !bytes.Equal(got, b) {
				t.Fatalf("marker %q, %v; want %q", got, err, b)
			}
			assertOnly(t, cache, s.Descriptor.Digest.Encoded())
			// And now it is used.
			if m3, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache)); err != nil || !m3.CacheHit {
				t.Fatalf("third materialize: %+v, %v", m3, err)
			}
		})
	}
}

// TestMaterializeConcurrent: materializations of one snapshot racing into
// one directory (in one process here; across processes the lock is the
// same flock) all succeed with the same complete directory.
func TestMaterializeConcurrent(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	cache := t.TempDir()
	for round := range 2 {
		if round == 1 {
			// The second round races to replace a directory of another boot.
			rewriteMarker(t, nodecache.OpenSnapshots(cache).Path(open(t, store, "v1", ReadOptions{}).Descriptor.Digest), []byte("cryo materialized\nboot x\n"))
		}
		var wg sync.WaitGroup
		ms := make([]*Materialized, 6)
		errs := make([]error, len(ms))
		for i := range ms {
			s := open(t, store, "v1", ReadOptions{})
			wg.Go(func() { ms[i], errs[i] = s.Materialize(context.Background(), nodecache.OpenSnapshots(cache)) })
		}
		wg.Wait()
		for i := range ms {
			if errs[i] != nil {
				t.Fatalf("round %d, materialization %d: %v", round, i, errs[i])
			}
			if ms[i].Dir != ms[0].Dir {
				t.Fatalf("dirs %s and %s", ms[i].Dir, ms[0].Dir)
			}
		}
		ts.checkFiles(t, ms[0])
		assertOnly(t, cache, filepath.Base(ms[0].Dir))
	}
}

// fileStoreSnapshot writes the test snapshot "v1" into a file store (an
// OCI layout on disk) and returns the store and its root.
func fileStoreSnapshot(t *testing.T, ts *testSnap) (stores.Store, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "layout")
	store, err := stores.NewFileStore(root)
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(ts.md, ts.paths)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, _, err := Write(context.Background(), store, "v1", src, WriteOptions{ChunkSize: testCS}); err != nil {
		t.Fatal(err)
	}
	return store, root
}

// otherBlobStore is a store that, asked for the blob want, hands out the
// node cache's genuine verified reader of another blob.
type otherBlobStore struct {
	stores.Store
	cs          *nodecache.CachingStore
	want, other ocispec.Descriptor
}

func (o *otherBlobStore) Fetch(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	if desc.Digest == o.want.Digest {
		return o.cs.Fetch(ctx, o.other, 0, -1)
	}
	return o.Store.Fetch(ctx, desc, off, n)
}

// TestTamperedBlobOutsideTheCache: only the node cache's verified readers
// skip the digest check. A blob changed in a store on disk is refused
// whether it is read from the store directly or through the cache (which
// refuses to take it in), and a store that passes off the cache's reader of
// another blob as the one asked for is refused too; nothing is left.
func TestTamperedBlobOutsideTheCache(t *testing.T) {
	ts := newTestSnap(t)
	ctx := context.Background()
	for _, tc := range []string{"direct", "through the cache", "verified reader of another blob"} {
		t.Run(tc, func(t *testing.T) {
			store, root := fileStoreSnapshot(t, ts)
			s, err := Open(ctx, store, "v1", ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			victim := s.chunks[len(s.chunks)/2].desc
			cache, err := nodecache.OpenBlobs(filepath.Join(t.TempDir(), "blobs"), 0)
			if err != nil {
				t.Fatal(err)
			}
			cs := nodecache.NewCachingStore(store, cache, nodecache.CachingOptions{})
			var read stores.Store
			switch tc {
			case "direct":
				read = store
			case "through the cache":
				read = cs
			default:
				other := s.chunks[0].desc
				if err := cs.Ensure(ctx, other); err != nil {
					t.Fatal(err)
				}
				read = &otherBlobStore{Store: store, cs: cs, want: victim, other: other}
			}
			if tc != "verified reader of another blob" {
				p := filepath.Join(root, "blobs", "sha256", victim.Digest.Encoded())
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				b[len(b)/2] ^= 0x01
				if err := os.WriteFile(p, b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			s, err = Open(ctx, read, "v1", ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "snapshots")
			if _, err := s.Materialize(ctx, nodecache.OpenSnapshots(out)); !errdefs.IsDataLoss(err) {
				t.Fatalf("materialize: %v, want data loss", err)
			}
			assertEmptyCache(t, out)
			if cache.Has(victim.Digest) {
				t.Fatal("tampered blob entered the cache")
			}
		})
	}
}

// TestMaterializedHitNeedsTheStore: a snapshot materialized on the node
// from one store is not handed to a restore through another store that
// holds its manifest but not its blobs (a tenant naming another's
// digests); it is to one that holds them all, and the second store's
// lock and confirmations are its own.
func TestMaterializedHitNeedsTheStore(t *testing.T) {
	ctx := context.Background()
	ts := newTestSnap(t)
	storeA := newMemStore()
	ts.write(t, storeA, "v1", WriteOptions{})
	sA := open(t, storeA, "v1", ReadOptions{})
	thief, full := newMemStore(), newMemStore()
	copyBlob := func(dst *memStore, d ocispec.Descriptor) {
		rc, err := storeA.Fetch(ctx, d, 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		if err := dst.Push(ctx, d, rc); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []ocispec.Descriptor{sA.Manifest.Config, sA.Descriptor} {
		copyBlob(thief, d)
	}
	for _, d := range append([]ocispec.Descriptor{sA.Manifest.Config, sA.Descriptor}, sA.Manifest.Layers...) {
		copyBlob(full, d)
	}
	for _, s := range []*memStore{thief, full} {
		if err := s.Tag(ctx, sA.Descriptor, "v1"); err != nil {
			t.Fatal(err)
		}
	}
	blobs, err := nodecache.OpenBlobs(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	snaps := nodecache.OpenSnapshots(t.TempDir())
	through := func(s stores.Store, url string) *Snapshot {
		t.Helper()
		cs := nodecache.NewCachingStore(s, blobs, nodecache.CachingOptions{StoreID: nodecache.StoreID(url)})
		snap, err := Open(ctx, cs, "v1", ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	if _, err := through(storeA, "mem://a").Materialize(ctx, snaps); err != nil {
		t.Fatal(err)
	}
	m, err := through(thief, "mem://b").Materialize(ctx, snaps)
	if err == nil || !errdefs.IsNotFound(err) {
		t.Fatalf("materialize through a store without the blobs: %v, %v: want not found", m, err)
	}
	m, err = through(full, "mem://c").Materialize(ctx, snaps)
	if err != nil || !m.CacheHit {
		t.Fatalf("materialize through a store with the blobs: %+v, %v: want a hit", m, err)
	}
	ts.checkFiles(t, m)
}
