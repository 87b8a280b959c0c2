package nodecache_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

func blobN(seed uint64, n int) storetest.Blob {
	return storetest.NewBlob("application/octet-stream", storetest.RandomBytes(seed, n))
}

func TestCacheAddVerifies(t *testing.T) {
	dir := t.TempDir()
	c, err := nodecache.OpenBlobs(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	b := blobN(1, 1000)
	bad := bytes.Clone(b.Data)
	bad[10] ^= 0x80
	ctx := context.Background()
	for name, data := range map[string][]byte{"flipped": bad, "short": b.Data[:999], "long": append(bytes.Clone(b.Data), 0)} {
		if err := c.Add(ctx, b.Desc, bytes.NewReader(data)); !errdefs.IsDataLoss(err) {
			t.Fatalf("%s: err = %v, want data loss", name, err)
		}
	}
	assertCacheEmpty(t, dir)
	if err := c.Add(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
		t.Fatal(err)
	}
	p, ok := c.Path(b.Desc.Digest)
	if !ok {
		t.Fatal("blob not in cache after Add")
	}
	info, err := os.Stat(p)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("cached blob: %v, mode %v", err, info.Mode().Perm())
	}
}

func TestCacheLRUAndPins(t *testing.T) {
	dir := t.TempDir()
	c, err := nodecache.OpenBlobs(dir, 3000)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	add := func(b storetest.Blob) {
		t.Helper()
		if err := c.Add(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
			t.Fatal(err)
		}
	}
	a, b, d, e := blobN(1, 1000), blobN(2, 1000), blobN(3, 1000), blobN(4, 1000)
	add(a)
	add(b)
	add(d)
	f, err := c.Open(a.Desc.Digest) // a is now the most recent; b the least
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	add(e)
	if c.Has(b.Desc.Digest) || !c.Has(a.Desc.Digest) || !c.Has(d.Desc.Digest) || !c.Has(e.Desc.Digest) {
		t.Fatal("adding over the limit did not evict exactly the least recently used blob")
	}
	unpin := c.Pin(d.Desc.Digest) // d is now the LRU but pinned
	add(b)
	if !c.Has(d.Desc.Digest) || c.Has(a.Desc.Digest) {
		t.Fatal("eviction took a pinned blob or skipped the next unpinned one")
	}
	unpin()
	if st := c.Stats(); st.Bytes != 3000 || st.Blobs != 3 || st.Evictions != 2 {
		t.Fatalf("stats = %+v", st)
	}
	if freed, err := c.Prune(1000); err != nil || freed != 2000 {
		t.Fatalf("prune freed %d, %v", freed, err)
	}

	// A new Cache over the same directory keeps the blobs and their order.
	c2, err := nodecache.OpenBlobs(dir, 3000)
	if err != nil {
		t.Fatal(err)
	}
	if st := c2.Stats(); st.Blobs != 1 || st.Bytes != 1000 {
		t.Fatalf("reopened stats = %+v", st)
	}
}

// slowLayout serves blobs from a file store over HTTP slowly enough that
// concurrent callers overlap, and counts the requests.
func TestCachingStoreSingleFlight(t *testing.T) {
	dir := t.TempDir()
	w, _ := openT(t, "file://"+dir+"/app")
	f := storetest.NewFixture("v1", 3)
	storetest.Seed(t, w, f)
	var mu sync.Mutex
	gets := map[string]int{}
	fs := http.FileServer(http.Dir(dir))
	srv := storetest.ServeHandler(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		gets[r.URL.Path]++
		mu.Unlock()
		time.Sleep(50 * time.Millisecond)
		fs.ServeHTTP(rw, r)
	}))
	s, _ := openT(t, srv+"/app")
	cs, cdir := newCachingStore(t, s, 1<<20)
	big := f.Layers[0]

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			rc, err := cs.Fetch(context.Background(), big.Desc, 100, 1000)
			if err != nil {
				errs <- err
				return
			}
			defer rc.Close()
			got, err := io.ReadAll(rc)
			if err == nil && !bytes.Equal(got, big.Data[100:1100]) {
				err = errors.New("wrong bytes")
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	st := cs.Blobs().Stats()
	if st.Downloads != 1 || st.BytesDownloaded != big.Desc.Size || st.SharedDownloads != 7 {
		t.Fatalf("stats = %+v: want one download of %d bytes shared by 7", st, big.Desc.Size)
	}
	if n := gets["/app/blobs/sha256/"+big.Desc.Digest.Encoded()]; n != 4 {
		t.Fatalf("%d GETs of the blob, want 4 ranged parts of one download", n)
	}
	// Served again from the cache: a hit, no request.
	if got := storetest.ReadAll(t, cs, big.Desc, 0, -1); !bytes.Equal(got, big.Data) {
		t.Fatal("cached content differs")
	}
	if st := cs.Blobs().Stats(); st.Hits != 1 || st.Downloads != 1 {
		t.Fatalf("stats after hit = %+v", st)
	}
	if _, err := os.Stat(filepath.Join(cdir, "blobs", "sha256", big.Desc.Digest.Encoded())); err != nil {
		t.Fatal(err)
	}
}

func TestCachingStoreRangeChecks(t *testing.T) {
	dir := t.TempDir()
	w, _ := openT(t, "file://"+dir+"/app")
	b := blobN(5, 100)
	if err := w.Push(context.Background(), b.Desc, bytes.NewReader(b.Data)); err != nil {
		t.Fatal(err)
	}
	cs, _ := newCachingStore(t, w, 1<<20)
	for _, r := range [][2]int64{{-1, 5}, {101, -1}, {50, 51}} {
		if _, err := cs.Fetch(context.Background(), b.Desc, r[0], r[1]); !errdefs.IsOutOfRange(err) {
			t.Errorf("range %v: err = %v, want out of range", r, err)
		}
	}
	if _, err := cs.Fetch(context.Background(), ocispec.Descriptor{Digest: "sha256:zz", Size: 1}, 0, -1); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad digest: err = %v", err)
	}
}

// A blob removed behind the cache's back (another process evicted it) is
// downloaded again instead of failing the read.
func TestCachingStoreBlobVanished(t *testing.T) {
	dir := t.TempDir()
	w, _ := openT(t, "file://"+dir+"/app")
	b := blobN(6, 5000)
	if err := w.Push(context.Background(), b.Desc, bytes.NewReader(b.Data)); err != nil {
		t.Fatal(err)
	}
	cs, cdir := newCachingStore(t, w, 1<<20)
	storetest.ReadAll(t, cs, b.Desc, 0, -1)
	if err := os.Remove(filepath.Join(cdir, "blobs", "sha256", b.Desc.Digest.Encoded())); err != nil {
		t.Fatal(err)
	}
	if got := storetest.ReadAll(t, cs, b.Desc, 10, 20); !bytes.Equal(got, b.Data[10:30]) {
		t.Fatal("wrong bytes after re-download")
	}
	if st := cs.Blobs().Stats(); st.Downloads != 2 {
		t.Fatalf("stats = %+v, want 2 downloads", st)
	}
}

func openT(t *testing.T, url string) (stores.Store, string) {
	t.Helper()
	s, ref, err := stores.Open(context.Background(), url, stores.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	return s, ref
}

// newCachingStore returns a caching store over s with a small part size, and
// the cache's directory.
func newCachingStore(t *testing.T, s stores.Store, partSize int64) (*nodecache.CachingStore, string) {
	t.Helper()
	dir := t.TempDir()
	c, err := nodecache.OpenBlobs(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return nodecache.NewCachingStore(s, c, nodecache.CachingOptions{PartSize: partSize, Parallel: 3}), dir
}

// TestCacheHostileEntries: a symlink or a FIFO in place of a cached blob
// is refused when the blob is opened, never followed or waited on; one
// there when the cache opens is not taken for a blob, and a download
// replaces it without writing through it.
func TestCacheHostileEntries(t *testing.T) {
	b := blobN(7, 4096)
	for _, kind := range []string{"symlink", "fifo"} {
		t.Run(kind, func(t *testing.T) {
			parent := t.TempDir()
			dir, outside := filepath.Join(parent, "cache"), filepath.Join(parent, "outside")
			must(t, os.Mkdir(outside, 0o700))
			target := filepath.Join(outside, "target")
			must(t, os.WriteFile(target, b.Data, 0o600))
			c, err := nodecache.OpenBlobs(dir, 1<<20)
			must(t, err)
			must(t, c.Add(context.Background(), b.Desc, bytes.NewReader(b.Data)))
			p := filepath.Join(dir, "blobs", "sha256", b.Desc.Digest.Encoded())
			plant := func() {
				os.Remove(p)
				if kind == "symlink" {
					must(t, os.Symlink(target, p))
				} else {
					must(t, syscall.Mkfifo(p, 0o600))
				}
			}
			plant()
			done := make(chan error, 1)
			go func() {
				r, err := c.Open(b.Desc.Digest)
				if err == nil {
					r.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, safefs.ErrUnsafe) {
					t.Fatalf("open: %v, want a refusal", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("open blocked")
			}
			c2, err := nodecache.OpenBlobs(dir, 1<<20)
			must(t, err)
			if c2.Has(b.Desc.Digest) {
				t.Fatal("a new cache took the planted entry for a blob")
			}
			must(t, c2.Add(context.Background(), b.Desc, bytes.NewReader(b.Data)))
			if st, err := os.Lstat(p); err != nil || !st.Mode().IsRegular() {
				t.Fatalf("after a download: %v, %v", st, err)
			}
			if got, _ := os.ReadFile(target); !bytes.Equal(got, b.Data) {
				t.Fatal("the symlink's target changed")
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func assertCacheEmpty(t *testing.T, dir string) {
	t.Helper()
	for _, sub := range []string{"blobs/sha256", "tmp"} {
		ents, err := os.ReadDir(filepath.Join(dir, sub))
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 0 {
			t.Fatalf("cache %s holds %d files after a refused blob", sub, len(ents))
		}
	}
}

// TestCachingStoreOneDownloadPerNode: caches of two processes (two Blobs
// over one directory, as two shims have) asked for one blob at once
// download it once; the other takes in the first's blob.
func TestCachingStoreOneDownloadPerNode(t *testing.T) {
	dir := t.TempDir()
	w, _ := openT(t, "file://"+dir+"/app")
	f := storetest.NewFixture("v1", 3)
	storetest.Seed(t, w, f)
	var mu sync.Mutex
	gets := 0
	fs := http.FileServer(http.Dir(dir))
	srv := storetest.ServeHandler(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		gets++
		mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		fs.ServeHTTP(rw, r)
	}))
	s, _ := openT(t, srv+"/app")
	cdir := t.TempDir()
	var css []*nodecache.CachingStore
	for range 2 {
		c, err := nodecache.OpenBlobs(cdir, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		css = append(css, nodecache.NewCachingStore(s, c, nodecache.CachingOptions{StoreID: nodecache.StoreID(srv + "/app")}))
	}
	big := f.Layers[0]
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, cs := range css {
		wg.Go(func() {
			got := storetest.ReadAll(t, cs, big.Desc, 0, -1)
			if !bytes.Equal(got, big.Data) {
				errs <- errors.New("wrong bytes")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	a, b := css[0].Blobs().Stats(), css[1].Blobs().Stats()
	if gets != 1 || a.BytesDownloaded+b.BytesDownloaded != big.Desc.Size || a.Adopted+b.Adopted != 1 {
		t.Fatalf("%d GETs; stats %+v and %+v: want one download and one adopted blob", gets, a, b)
	}
	if ents, _ := os.ReadDir(filepath.Join(cdir, "locks")); len(ents) != 0 {
		t.Fatalf("%d download locks left", len(ents))
	}
}
