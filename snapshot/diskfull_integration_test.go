//go:build integration

package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cryo-runtime/cryo/nodecache"
	"golang.org/x/sys/unix"
)

// TestMaterializeDiskFullTmpfs materializes into a real 1 MiB tmpfs: the
// kernel's ENOSPC surfaces as the error and the file system is left empty.
func TestMaterializeDiskFullTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root to mount a tmpfs: run the integration tests as root")
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m,mode=0700"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})

	ts := newTestSnap(t) // about 2.3 MiB of non-zero data
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	s := open(t, store, "v1", ReadOptions{})
	cache := filepath.Join(mnt, "cache")
	m, err := s.Materialize(context.Background(), nodecache.OpenSnapshots(cache))
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("materialize into a full tmpfs: %+v, %v", m, err)
	}
	t.Logf("refused: %v", err)
	assertEmptyCache(t, cache)
	assertOnly(t, mnt, "cache")
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	if used := (st.Blocks - st.Bfree) * uint64(st.Bsize); used > 64<<10 {
		t.Errorf("%d bytes still used on the tmpfs", used)
	}

	// With room, the same snapshot materializes.
	big := filepath.Join(t.TempDir(), "cache")
	if _, err := s.Materialize(context.Background(), nodecache.OpenSnapshots(big)); err != nil {
		t.Fatal(err)
	}
}
