package fetch_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/fetch"
	"github.com/cryo-runtime/cryo/fetch/fetchtest"
)

func blobN(seed uint64, n int) fetchtest.Blob {
	return fetchtest.NewBlob("application/octet-stream", fetchtest.RandomBytes(seed, n))
}

func TestCacheAddVerifies(t *testing.T) {
	dir := t.TempDir()
	c, err := fetch.NewCache(dir, 1<<20)
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
	c, err := fetch.NewCache(dir, 3000)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	add := func(b fetchtest.Blob) {
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
	c2, err := fetch.NewCache(dir, 3000)
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
	f := fetchtest.NewFixture("v1", 3)
	fetchtest.Seed(t, w, f)
	var mu sync.Mutex
	gets := map[string]int{}
	fs := http.FileServer(http.Dir(dir))
	srv := fetchtest.ServeHandler(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
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
	st := cs.Cache().Stats()
	if st.Downloads != 1 || st.BytesDownloaded != big.Desc.Size || st.SharedDownloads != 7 {
		t.Fatalf("stats = %+v: want one download of %d bytes shared by 7", st, big.Desc.Size)
	}
	if n := gets["/app/blobs/sha256/"+big.Desc.Digest.Encoded()]; n != 4 {
		t.Fatalf("%d GETs of the blob, want 4 ranged parts of one download", n)
	}
	// Served again from the cache: a hit, no request.
	if got := fetchtest.ReadAll(t, cs, big.Desc, 0, -1); !bytes.Equal(got, big.Data) {
		t.Fatal("cached content differs")
	}
	if st := cs.Cache().Stats(); st.Hits != 1 || st.Downloads != 1 {
		t.Fatalf("stats after hit = %+v", st)
	}
	if _, err := os.Stat(filepath.Join(cdir, "blobs", "sha256", big.Desc.Digest.Encoded())); err != nil {
		t.Fatal(err)
	}
}

func TestCachingStoreCancelledWaiterCancelsDownload(t *testing.T) {
	h := newHostile(1 << 20)
	started := make(chan struct{})
	h.act = func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool {
		close(started)
		<-r.Context().Done() // hangs until the download is cancelled
		return true
	}
	cs, dir := newCachingStore(t, startHostileLayout(t, h), 16<<20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- cs.Ensure(ctx, h.blob.Desc) }()
	<-started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want canceled", err)
	}
	// The download goroutine is cancelled with the last waiter and cleans up.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ents, _ := os.ReadDir(filepath.Join(dir, "tmp"))
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("temp file left after the download was cancelled")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if cs.Cache().Has(h.blob.Desc.Digest) {
		t.Fatal("cancelled download entered the cache")
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
	fetchtest.ReadAll(t, cs, b.Desc, 0, -1)
	if err := os.Remove(filepath.Join(cdir, "blobs", "sha256", b.Desc.Digest.Encoded())); err != nil {
		t.Fatal(err)
	}
	if got := fetchtest.ReadAll(t, cs, b.Desc, 10, 20); !bytes.Equal(got, b.Data[10:30]) {
		t.Fatal("wrong bytes after re-download")
	}
	if st := cs.Cache().Stats(); st.Downloads != 2 {
		t.Fatalf("stats = %+v, want 2 downloads", st)
	}
}
