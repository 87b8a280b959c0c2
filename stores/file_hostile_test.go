package stores_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

// TestFileStoreHostileEntries: whoever can write a file store cannot make
// the node read or write outside it with symlinks, nor block it with a
// FIFO or a socket where a blob or the index should be.
func TestFileStoreHostileEntries(t *testing.T) {
	blob := storetest.NewBlob("application/octet-stream", []byte("the blob's bytes"))
	other := storetest.NewBlob("application/octet-stream", []byte("pushed after the edit"))
	hexName := blob.Desc.Digest.Encoded()
	cases := []struct {
		name string
		// edit changes the store under root; outside is a directory
		// beside it that the writer points at.
		edit func(t *testing.T, root, outside string)
		// op is what must be refused.
		op func(s stores.Store) error
	}{
		{"blob is a symlink to a host file with its bytes", func(t *testing.T, root, outside string) {
			p := filepath.Join(root, "blobs", "sha256", hexName)
			os.WriteFile(filepath.Join(outside, "copy"), blob.Data, 0o600)
			os.Remove(p)
			must(t, os.Symlink(filepath.Join(outside, "copy"), p))
		}, fetchOp(blob)},
		{"blob is a symlink, existence", func(t *testing.T, root, outside string) {
			p := filepath.Join(root, "blobs", "sha256", hexName)
			os.WriteFile(filepath.Join(outside, "copy"), blob.Data, 0o600)
			os.Remove(p)
			must(t, os.Symlink(filepath.Join(outside, "copy"), p))
		}, func(s stores.Store) error { _, err := s.Exists(context.Background(), blob.Desc); return err }},
		{"blob is a FIFO", func(t *testing.T, root, outside string) {
			p := filepath.Join(root, "blobs", "sha256", hexName)
			os.Remove(p)
			must(t, syscall.Mkfifo(p, 0o600))
		}, fetchOp(blob)},
		{"blob is a socket", func(t *testing.T, root, outside string) {
			p := filepath.Join(root, "blobs", "sha256", hexName)
			os.Remove(p)
			must(t, syscall.Mknod(p, syscall.S_IFSOCK|0o600, 0))
		}, fetchOp(blob)},
		{"blobs directory is a symlink", func(t *testing.T, root, outside string) {
			must(t, os.Rename(filepath.Join(root, "blobs", "sha256"), filepath.Join(outside, "sha256")))
			must(t, os.Symlink(filepath.Join(outside, "sha256"), filepath.Join(root, "blobs", "sha256")))
		}, fetchOp(blob)},
		{"push through a symlinked blobs directory", func(t *testing.T, root, outside string) {
			must(t, os.RemoveAll(filepath.Join(root, "blobs", "sha256")))
			must(t, os.Symlink(outside, filepath.Join(root, "blobs", "sha256")))
		}, pushOp(other)},
		{"push through a symlinked ingest directory", func(t *testing.T, root, outside string) {
			must(t, os.RemoveAll(filepath.Join(root, "ingest")))
			must(t, os.Symlink(outside, filepath.Join(root, "ingest")))
		}, pushOp(other)},
		{"index is a symlink", func(t *testing.T, root, outside string) {
			b, _ := os.ReadFile(filepath.Join(root, "index.json"))
			os.WriteFile(filepath.Join(outside, "index.json"), b, 0o600)
			os.Remove(filepath.Join(root, "index.json"))
			must(t, os.Symlink(filepath.Join(outside, "index.json"), filepath.Join(root, "index.json")))
		}, func(s stores.Store) error { _, err := s.Resolve(context.Background(), "v1"); return err }},
		{"index is a FIFO", func(t *testing.T, root, outside string) {
			os.Remove(filepath.Join(root, "index.json"))
			must(t, syscall.Mkfifo(filepath.Join(root, "index.json"), 0o600))
		}, func(s stores.Store) error { _, err := s.Resolve(context.Background(), "v1"); return err }},
		{"tag through a symlinked index", func(t *testing.T, root, outside string) {
			os.Remove(filepath.Join(root, "index.json"))
			must(t, os.Symlink(filepath.Join(outside, "index.json"), filepath.Join(root, "index.json")))
		}, func(s stores.Store) error {
			return s.Tag(context.Background(), blob.Desc, "v2")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			root, outside := filepath.Join(parent, "store"), filepath.Join(parent, "outside")
			must(t, os.Mkdir(outside, 0o700))
			s, err := stores.NewFileStore(root)
			must(t, err)
			ctx := context.Background()
			must(t, s.Push(ctx, blob.Desc, bytes.NewReader(blob.Data)))
			must(t, s.Tag(ctx, blob.Desc, "v1"))
			tc.edit(t, root, outside)
			before := listTree(t, outside)
			done := make(chan error, 1)
			go func() { done <- tc.op(s) }()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the store blocked")
			}
			if !errors.Is(err, safefs.ErrUnsafe) || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want a refusal", err)
			}
			t.Logf("refused: %v", err)
			if after := listTree(t, outside); !equalStrings(before, after) {
				t.Fatalf("outside the store: %v, then %v", before, after)
			}
		})
	}
}

// TestFileStoreRootThroughSymlink: a store's own path must not pass
// through a symlink, which a writer of the parent directory could plant.
func TestFileStoreRootThroughSymlink(t *testing.T) {
	parent, target := t.TempDir(), t.TempDir()
	must(t, os.Symlink(target, filepath.Join(parent, "team-a")))
	_, err := stores.NewFileStore(filepath.Join(parent, "team-a", "store"))
	if !errors.Is(err, safefs.ErrUnsafe) {
		t.Fatalf("got %v, want a refusal", err)
	}
	if ents, _ := os.ReadDir(target); len(ents) != 0 {
		t.Fatalf("created %v through the symlink", ents)
	}
}

func fetchOp(b storetest.Blob) func(stores.Store) error {
	return func(s stores.Store) error {
		rc, err := s.Fetch(context.Background(), b.Desc, 0, -1)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.ReadAll(rc)
		if err == nil {
			err = errors.New("fetched")
		}
		return err
	}
}

func pushOp(b storetest.Blob) func(stores.Store) error {
	return func(s stores.Store) error { return s.Push(context.Background(), b.Desc, bytes.NewReader(b.Data)) }
}

// listTree lists every path under dir with its size.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			out = append(out, p+" "+fi.Mode().String())
		}
		return nil
	})
	return out
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
