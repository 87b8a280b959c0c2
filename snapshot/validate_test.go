package snapshot

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/nodecache"
)

// TestReadFile: a small file is read into memory whole, full chunks and
// deltas alike, encrypted or not, and nothing is written; a file over the
// limit is refused before any chunk is fetched.
func TestReadFile(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "encrypted"}[enc], func(t *testing.T) {
			ts := newTestSnap(t)
			store := newMemStore()
			var opts WriteOptions
			var ropts ReadOptions
			if enc {
				opts.EncryptionKey = bytes.Repeat([]byte{7}, 32)
				ropts.DecryptionKey = opts.EncryptionKey
			}
			deltaSetup(t, ts, store, opts)
			s := open(t, store, "v2", ropts)
			if len(s.deltas) == 0 {
				t.Fatal("setup: v2 has no deltas")
			}
			ctx := context.Background()
			spec, err := s.ReadFile(ctx, FileSpec, 1<<20)
			if err != nil || !bytes.Equal(spec, ts.paths.Spec) {
				t.Fatalf("spec %q, %v; want %q", spec, err, ts.paths.Spec)
			}
			want, _ := os.ReadFile(ts.paths.DevState)
			got, err := s.ReadFile(ctx, FileDevState, 1<<20) // a delta at its last chunk
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("devstate: %d bytes, %v; want the %d bytes written", len(got), err, len(want))
			}
			fetches := store.fetches.Load()
			if _, err := s.ReadFile(ctx, FileRAM, 1<<20); !errdefs.IsInvalidArgument(err) {
				t.Fatalf("ram over the limit: %v", err)
			}
			if n := store.fetches.Load(); n != fetches {
				t.Errorf("a refused read fetched %d blobs", n-fetches)
			}
			if _, err := s.ReadFile(ctx, DiskFile("nope"), 1<<20); !errdefs.IsNotFound(err) {
				t.Fatalf("missing file: %v", err)
			}
		})
	}
}

// TestMaterializedHostileEntries: symlinks and FIFOs planted in the
// materialized cache are never followed nor waited on: a symlinked
// snapshot directory or lock file is refused or replaced, a FIFO in place
// of the spec is refused at once, and nothing outside the cache changes.
func TestMaterializedHostileEntries(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (s *Snapshot, cache, outside string) {
		ts := newTestSnap(t)
		store := newMemStore()
		ts.write(t, store, "v1", WriteOptions{})
		parent := t.TempDir()
		cache, outside = filepath.Join(parent, "cache"), filepath.Join(parent, "outside")
		if err := os.MkdirAll(outside, 0o700); err != nil {
			t.Fatal(err)
		}
		return open(t, store, "v1", ReadOptions{}), cache, outside
	}
	t.Run("snapshot directory is a symlink to a complete copy", func(t *testing.T) {
		s, cache, outside := setup(t)
		m, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache))
		if err != nil {
			t.Fatal(err)
		}
		copyDir := filepath.Join(outside, "copy")
		if err := os.Rename(m.Dir, copyDir); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(copyDir, m.Dir); err != nil {
			t.Fatal(err)
		}
		m2, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache))
		if err != nil {
			t.Fatal(err)
		}
		if m2.CacheHit {
			t.Fatal("a symlinked directory was taken for a complete materialization")
		}
		if st, err := os.Lstat(m2.Dir); err != nil || !st.IsDir() {
			t.Fatalf("materialized %v, %v", st, err)
		}
		if _, err := os.Stat(filepath.Join(copyDir, nodecache.CompleteFile)); err != nil {
			t.Fatalf("the symlink's target was changed: %v", err)
		}
	})
	t.Run("lock and use files are symlinks", func(t *testing.T) {
		s, cache, outside := setup(t)
		os.MkdirAll(cache, 0o700)
		target := filepath.Join(outside, "victim")
		os.WriteFile(target, []byte("host file"), 0o600)
		os.Symlink(target, filepath.Join(cache, "."+s.Descriptor.Digest.Encoded()+".use"))
		os.Symlink(target, filepath.Join(cache, "."+s.Descriptor.Digest.Encoded()+".lock"))
		if _, err := nodecache.OpenSnapshots(cache).Use(ctx, s.Descriptor.Digest); !errors.Is(err, safefs.ErrUnsafe) {
			t.Fatalf("use: %v, want a refusal", err)
		}
		if _, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache)); !errors.Is(err, safefs.ErrUnsafe) {
			t.Fatalf("materialize: %v, want a refusal", err)
		}
		if b, _ := os.ReadFile(target); string(b) != "host file" {
			t.Fatalf("the target changed: %q", b)
		}
	})
	t.Run("spec is a FIFO", func(t *testing.T) {
		s, cache, _ := setup(t)
		m, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache))
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(m.Dir, 0o700)
		os.Remove(m.Spec)
		if err := syscall.Mkfifo(m.Spec, 0o600); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := m.ReadSpec(); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, safefs.ErrUnsafe) {
				t.Fatalf("read spec: %v, want a refusal", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("ReadSpec blocked on a FIFO")
		}
		if _, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache)); !errdefs.IsDataLoss(err) {
			t.Fatalf("a materialization with a FIFO for a file: %v, want data loss", err)
		}
	})
}
