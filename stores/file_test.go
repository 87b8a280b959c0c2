package stores_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

func openT(t *testing.T, url string) (stores.Store, string) {
	t.Helper()
	s, ref, err := stores.Open(context.Background(), url, stores.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	return s, ref
}

func TestFileStore(t *testing.T) {
	dir := t.TempDir()
	s, ref := openT(t, "file://"+dir+"/app:v1")
	if ref != "v1" {
		t.Fatalf("ref = %q", ref)
	}
	storetest.RunStoreSuite(t, s)

	root := filepath.Join(dir, "app")
	t.Run("layout-and-permissions", func(t *testing.T) {
		for _, f := range []string{"oci-layout", "index.json"} {
			if _, err := os.Stat(filepath.Join(root, f)); err != nil {
				t.Fatal(err)
			}
		}
		blobs, _ := os.ReadDir(filepath.Join(root, "blobs", "sha256"))
		if len(blobs) < 4 {
			t.Fatalf("%d blobs in the layout, want >= 4", len(blobs))
		}
		for _, b := range blobs {
			info, _ := b.Info()
			if info.Mode().Perm() != 0o600 {
				t.Errorf("blob %s mode %v, want 0600", b.Name(), info.Mode().Perm())
			}
		}
		if info, _ := os.Stat(filepath.Join(root, "index.json")); info.Mode().Perm() != 0o600 {
			t.Errorf("index.json mode %v", info.Mode().Perm())
		}
		ingest, _ := os.ReadDir(filepath.Join(root, "ingest"))
		for _, e := range ingest {
			if !strings.HasPrefix(e.Name(), ".index.lock") {
				t.Errorf("leftover in ingest/: %s", e.Name())
			}
		}
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			if strings.Contains(e.Name(), ".tmp-") {
				t.Errorf("leftover temp file %s", e.Name())
			}
		}
	})
	t.Run("second-open-sees-tags", func(t *testing.T) {
		s2, _ := openT(t, "file://"+root)
		if tags, err := s2.Tags(context.Background()); err != nil || len(tags) != 1 || tags[0] != "v1" {
			t.Fatalf("tags = %v, %v", tags, err)
		}
	})
	t.Run("relative-path-refused", func(t *testing.T) {
		if _, err := stores.NewFileStore("rel/dir"); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestHTTPStore reads a file store's layout through a real net/http
// FileServer.
func TestHTTPStore(t *testing.T) {
	dir := t.TempDir()
	w, _ := openT(t, "file://"+dir+"/app")
	f := storetest.NewFixture("v1", 7)
	storetest.Seed(t, w, f)
	base := storetest.ServeDir(t, dir)
	s, ref := openT(t, base+"/app:v1")
	if ref != "v1" {
		t.Fatalf("ref = %q", ref)
	}
	storetest.CheckRead(t, s, f)
	storetest.CheckReadOnly(t, s, f)
}

func TestFileStoreGC(t *testing.T) {
	dir := t.TempDir()
	s, _ := openT(t, "file://"+dir+"/app")
	f, g := storetest.NewFixture("v1", 1), storetest.NewFixture("v2", 2)
	storetest.Seed(t, s, f)
	storetest.Seed(t, s, g)
	ctx := context.Background()
	if err := s.Untag(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	res, err := stores.GC(ctx, s, stores.GCOptions{})
	if err != nil || res.Deleted != 0 || res.Kept != 4 {
		t.Fatalf("gc within grace = %+v, %v", res, err)
	}
	res, err = stores.GC(ctx, s, stores.GCOptions{Grace: -1, DryRun: true})
	if err != nil || res.Deleted != 4 {
		t.Fatalf("dry run = %+v, %v", res, err)
	}
	if ok, _ := s.Exists(ctx, g.Manifest.Desc); !ok {
		t.Fatal("dry run deleted")
	}
	// What a running lazy sandbox still reads stays.
	kept := g.Layers[0].Desc
	res, err = stores.GC(ctx, s, stores.GCOptions{Grace: -1, DryRun: true, Keep: []digest.Digest{kept.Digest}})
	if err != nil || res.Deleted != 3 {
		t.Fatalf("dry run keeping a leased blob = %+v, %v", res, err)
	}
	res, err = stores.GC(ctx, s, stores.GCOptions{Grace: -1})
	if err != nil || res.Deleted != 4 || res.Reachable != 4 {
		t.Fatalf("gc = %+v, %v", res, err)
	}
	for _, b := range g.All() {
		if ok, _ := s.Exists(ctx, b.Desc); ok {
			t.Fatalf("unreferenced %s survived", b.Desc.Digest)
		}
	}
	storetest.CheckRead(t, s, f)
}

// TestFileStoreTruncatedBlob: a blob cut short in a file store is data
// loss (no retry mends it), not an error to retry or a short read.
func TestFileStoreTruncatedBlob(t *testing.T) {
	dir := t.TempDir()
	s, _ := openT(t, "file://"+dir+"/app:v1")
	data := []byte(strings.Repeat("cryo", 1024))
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(data), Size: int64(len(data))}
	if err := s.Push(context.Background(), desc, strings.NewReader(string(data))); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "app", "blobs", "sha256", desc.Digest.Encoded())
	if err := os.Truncate(p, 100); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 2048} {
		rc, err := s.Fetch(context.Background(), desc, off, 1024)
		if err == nil {
			rc.Close()
		}
		if !errdefs.IsDataLoss(err) {
			t.Errorf("fetch at %d of a truncated blob: %v; want data loss", off, err)
		}
	}
}
