package nodecache_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/bootid"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

const stampAttr = "user.cryo.verified-boot"

// A CachingStore hands out *nodecache.VerifiedReader for exactly the blob asked
// for; ReadAt reads the whole blob, Read the range.
func TestCachingStoreVerifiedReader(t *testing.T) {
	dir := t.TempDir()
	w, _ := openT(t, "file://"+dir+"/app")
	b := blobN(7, 10000)
	if err := w.Push(context.Background(), b.Desc, bytes.NewReader(b.Data)); err != nil {
		t.Fatal(err)
	}
	cs, _ := newCachingStore(t, w, 1<<20)
	rc, err := cs.Fetch(context.Background(), b.Desc, 100, 50)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	v, ok := rc.(*nodecache.VerifiedReader)
	if !ok {
		t.Fatalf("Fetch returned %T, want *nodecache.VerifiedReader", rc)
	}
	if !v.Verifies(b.Desc.Digest, b.Desc.Size) || v.Digest() != b.Desc.Digest || v.Size() != b.Desc.Size {
		t.Fatalf("reader says %s (%d bytes), want %s (%d)", v.Digest(), v.Size(), b.Desc.Digest, b.Desc.Size)
	}
	other := blobN(8, 10000).Desc
	if v.Verifies(other.Digest, other.Size) {
		t.Fatal("reader verifies another blob")
	}
	whole := make([]byte, b.Desc.Size)
	if n, err := v.ReadAt(whole, 0); n != len(whole) || err != nil || !bytes.Equal(whole, b.Data) {
		t.Fatalf("ReadAt: %d, %v", n, err)
	}
	if got := storetest.ReadAll(t, cs, b.Desc, 100, 50); !bytes.Equal(got, b.Data[100:150]) {
		t.Fatal("range differs")
	}
	// The zero value verifies nothing and reads nothing.
	var zero nodecache.VerifiedReader
	if zero.Verifies(b.Desc.Digest, b.Desc.Size) {
		t.Fatal("zero VerifiedReader verifies")
	}
	if n, err := zero.Read(make([]byte, 10)); n != 0 || err == nil {
		t.Fatalf("zero Read: %d, %v", n, err)
	}
}

// A blob stamped in another boot (or not at all) is hashed again when it is
// opened: intact, it is stamped with this boot; torn (a machine crash after
// the rename, before writeback), it is removed and downloaded again.
func TestCacheReverifiesBlobsOfEarlierBoots(t *testing.T) {
	boot, err := bootid.Get()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, _ := openT(t, "file://"+dir+"/app")
	intact, torn := blobN(9, 5000), blobN(10, 5000)
	ctx := context.Background()
	for _, b := range []storetest.Blob{intact, torn} {
		if err := w.Push(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
			t.Fatal(err)
		}
	}
	cs, cdir := newCachingStore(t, w, 1<<20)
	path := func(b storetest.Blob) string {
		return filepath.Join(cdir, "blobs", "sha256", b.Desc.Digest.Encoded())
	}
	for _, b := range []storetest.Blob{intact, torn} {
		storetest.ReadAll(t, cs, b.Desc, 0, -1)
	}
	xattrs := true
	var buf [64]byte
	switch n, err := unix.Getxattr(path(intact), stampAttr, buf[:]); {
	case errors.Is(err, unix.ENOTSUP):
		xattrs = false // every open verifies: the assertions below hold too
		t.Log("no user xattrs on this file system")
	case err != nil:
		t.Fatal(err)
	case string(buf[:n]) != boot:
		t.Fatalf("stamp %q, want this boot %q", buf[:n], boot)
	}
	if xattrs {
		for _, b := range []storetest.Blob{intact, torn} {
			if err := unix.Setxattr(path(b), stampAttr, []byte("an-earlier-boot-0000"), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Torn: the second half never reached the disk.
	if err := os.Truncate(path(torn), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path(torn), torn.Desc.Size); err != nil {
		t.Fatal(err)
	}

	c := cs.Blobs()
	v, err := c.Open(intact.Desc.Digest)
	if err != nil {
		t.Fatalf("intact blob of an earlier boot: %v", err)
	}
	v.Close()
	if n, err := unix.Getxattr(path(intact), stampAttr, buf[:]); xattrs && (err != nil || string(buf[:n]) != boot) {
		t.Fatalf("not stamped again: %q, %v", buf[:n], err)
	}
	if _, err := c.Open(torn.Desc.Digest); !errdefs.IsNotFound(err) || !errors.Is(err, stores.ErrDigestMismatch) {
		t.Fatalf("torn blob: err = %v, want not found (digest mismatch)", err)
	}
	if c.Has(torn.Desc.Digest) {
		t.Fatal("torn blob still in the cache")
	}
	if _, err := os.Stat(path(torn)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("torn blob file left: %v", err)
	}
	before := c.Stats().Downloads
	if got := storetest.ReadAll(t, cs, torn.Desc, 0, -1); !bytes.Equal(got, torn.Data) {
		t.Fatal("wrong bytes after re-download")
	}
	if d := c.Stats().Downloads - before; d != 1 {
		t.Fatalf("%d downloads, want 1", d)
	}

	// Torn behind an already loaded entry, read through the CachingStore:
	// removed and downloaded again within one Fetch.
	if xattrs {
		if err := unix.Setxattr(path(intact), stampAttr, []byte("an-earlier-boot-0000"), 0); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path(intact), make([]byte, intact.Desc.Size), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := storetest.ReadAll(t, cs, intact.Desc, 0, -1); !bytes.Equal(got, intact.Data) {
			t.Fatal("torn blob served")
		}
	}
}
