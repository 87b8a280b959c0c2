package nodecache_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

// countingStore serves the file store in dir over HTTP and counts the
// requests by method.
func countingStore(t *testing.T, dir string, slow func(w http.ResponseWriter, r *http.Request) http.ResponseWriter) (url string, count func(method string) int) {
	var mu sync.Mutex
	n := map[string]int{}
	fs := http.FileServer(http.Dir(dir))
	srv := storetest.ServeHandler(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n[r.Method]++
		mu.Unlock()
		if slow != nil {
			rw = slow(rw, r)
		}
		fs.ServeHTTP(rw, r)
	}))
	return srv + "/app", func(m string) int {
		mu.Lock()
		defer mu.Unlock()
		return n[m]
	}
}

// TestCachingStoreTenantNotServedFromOthersCache: tenant A's store brought
// a blob into the node cache; tenant B, whose store does not hold it, is
// not served it by digest (Fetch, FetchVerified), learns nothing from
// Exists, whether B's cache already indexed the blob or finds it on disk
// while it downloads (another process of the node).
func TestCachingStoreTenantNotServedFromOthersCache(t *testing.T) {
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	urlA, urlB := "file://"+dirA+"/app", "file://"+dirB+"/app"
	storeA, _ := openT(t, urlA)
	storeB, _ := openT(t, urlB)
	secret := blobN(21, 5000)
	if err := storeA.Push(ctx, secret.Desc, bytes.NewReader(secret.Data)); err != nil {
		t.Fatal(err)
	}
	cdir := t.TempDir()
	c, err := nodecache.OpenBlobs(cdir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	// A process that opened the cache before A's download.
	early, err := nodecache.OpenBlobs(cdir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	csA := nodecache.NewCachingStore(storeA, c, nodecache.CachingOptions{StoreID: nodecache.StoreID(urlA)})
	if got := storetest.ReadAll(t, csA, secret.Desc, 0, -1); !bytes.Equal(got, secret.Data) {
		t.Fatal("A: wrong bytes")
	}
	// A process that opened the cache after it.
	late, err := nodecache.OpenBlobs(cdir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*nodecache.Blobs{"same process": c, "indexed on open": late, "found while downloading": early} {
		for _, id := range []string{nodecache.StoreID(urlB), ""} {
			csB := nodecache.NewCachingStore(storeB, b, nodecache.CachingOptions{StoreID: id})
			if ok, err := csB.Exists(ctx, secret.Desc); ok || err != nil {
				t.Fatalf("%s, id %q: B's Exists = %v, %v: the cache answered for B's store", name, id, ok, err)
			}
			if rc, err := csB.Fetch(ctx, secret.Desc, 0, -1); !errdefs.IsNotFound(err) {
				if err == nil {
					rc.Close()
				}
				t.Fatalf("%s, id %q: B's Fetch err = %v: B was served A's blob", name, id, err)
			}
			if v, err := csB.FetchVerified(ctx, secret.Desc); !errdefs.IsNotFound(err) {
				if err == nil {
					v.Close()
				}
				t.Fatalf("%s, id %q: B's FetchVerified err = %v: B was served A's blob", name, id, err)
			}
		}
	}
	// A is still served, and so is B once its own store holds the blob.
	if ok, err := csA.Exists(ctx, secret.Desc); !ok || err != nil {
		t.Fatalf("A's Exists = %v, %v", ok, err)
	}
	if err := storeB.Push(ctx, secret.Desc, bytes.NewReader(secret.Data)); err != nil {
		t.Fatal(err)
	}
	csB := nodecache.NewCachingStore(storeB, late, nodecache.CachingOptions{StoreID: nodecache.StoreID(urlB)})
	if got := storetest.ReadAll(t, csB, secret.Desc, 0, -1); !bytes.Equal(got, secret.Data) {
		t.Fatal("B: wrong bytes")
	}
}

// TestCachingStoreConfirmedStoreServedOnce: a store that holds a blob
// another store brought into the cache is asked once (a HEAD, no
// download); the confirmation is remembered on disk (0600 in 0700), so
// another process of the node serves it without asking again.
func TestCachingStoreConfirmedStoreServedOnce(t *testing.T) {
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	urlA := "file://" + dirA + "/app"
	storeA, _ := openT(t, urlA)
	wB, _ := openT(t, "file://"+dirB+"/app")
	b := blobN(22, 7000)
	for _, s := range []stores.Store{storeA, wB} {
		if err := s.Push(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
			t.Fatal(err)
		}
	}
	urlB, count := countingStore(t, dirB, nil)
	storeB, _ := openT(t, urlB)
	cdir := t.TempDir()
	c, err := nodecache.OpenBlobs(cdir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	storetest.ReadAll(t, nodecache.NewCachingStore(storeA, c, nodecache.CachingOptions{StoreID: nodecache.StoreID(urlA)}), b.Desc, 0, -1)
	idB := nodecache.StoreID(urlB)
	csB := nodecache.NewCachingStore(storeB, c, nodecache.CachingOptions{StoreID: idB})
	for range 3 {
		if got := storetest.ReadAll(t, csB, b.Desc, 0, -1); !bytes.Equal(got, b.Data) {
			t.Fatal("B: wrong bytes")
		}
	}
	if g, h := count(http.MethodGet), count(http.MethodHead); g != 0 || h != 1 {
		t.Fatalf("B's store saw %d GETs and %d HEADs, want 0 and 1", g, h)
	}
	if st := c.Stats(); st.Downloads != 1 {
		t.Fatalf("stats = %+v, want one download", st)
	}
	marker := filepath.Join(cdir, "confirmed", idB, b.Desc.Digest.Encoded())
	info, err := os.Lstat(marker)
	if err != nil || !info.Mode().IsRegular() || info.Mode().Perm() != 0o600 {
		t.Fatalf("confirmation %s: %v, %v", marker, info, err)
	}
	if info, err := os.Lstat(filepath.Dir(marker)); err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("confirmation dir: %v, %v", info, err)
	}
	// Another process: no request at all.
	other, err := nodecache.OpenBlobs(cdir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	csB2 := nodecache.NewCachingStore(storeB, other, nodecache.CachingOptions{StoreID: idB})
	if ok, err := csB2.Exists(ctx, b.Desc); !ok || err != nil {
		t.Fatalf("Exists = %v, %v", ok, err)
	}
	storetest.ReadAll(t, csB2, b.Desc, 0, -1)
	if g, h := count(http.MethodGet), count(http.MethodHead); g != 0 || h != 1 {
		t.Fatalf("after another process: B's store saw %d GETs and %d HEADs, want 0 and 1", g, h)
	}
	// Store ids ignore the reference and credentials, not the path.
	if nodecache.StoreID("s3://b/ns/app:v1") != nodecache.StoreID("s3://b/ns/app@sha256:"+b.Desc.Digest.Encoded()) ||
		nodecache.StoreID("s3://b/ns/app") == nodecache.StoreID("s3://b/other/app") {
		t.Fatal("StoreID")
	}
}

// trickle writes one byte every 100ms: never a stall, never done.
type trickle struct {
	http.ResponseWriter
	ctx context.Context
}

func (w trickle) Write(b []byte) (int, error) {
	for i := range b {
		select {
		case <-w.ctx.Done():
			return i, w.ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if _, err := w.ResponseWriter.Write(b[i : i+1]); err != nil {
			return i, err
		}
		w.ResponseWriter.(http.Flusher).Flush()
	}
	return len(b), nil
}

// TestCachingStoreTrickleCut: a store that trickles a blob is cut at its
// download deadline, and another store's download of the same digest
// meanwhile neither waits for it nor shares its fate.
func TestCachingStoreTrickleCut(t *testing.T) {
	ctx := context.Background()
	dirS, dirF := t.TempDir(), t.TempDir()
	b := blobN(23, 4000)
	for _, d := range []string{dirS, dirF} {
		w, _ := openT(t, "file://"+d+"/app")
		if err := w.Push(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
			t.Fatal(err)
		}
	}
	started := make(chan struct{})
	var once sync.Once
	urlS, _ := countingStore(t, dirS, func(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
		if r.Method != http.MethodGet {
			return w
		}
		once.Do(func() { close(started) })
		return trickle{w, r.Context()}
	})
	urlF, _ := countingStore(t, dirF, nil)
	slow, _ := openT(t, urlS)
	fast, _ := openT(t, urlF)
	c, err := nodecache.OpenBlobs(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	opts := func(u string) nodecache.CachingOptions {
		return nodecache.CachingOptions{StoreID: nodecache.StoreID(u), DownloadDeadline: 2 * time.Second, MinRate: 1 << 30}
	}
	csS := nodecache.NewCachingStore(slow, c, opts(urlS))
	csF := nodecache.NewCachingStore(fast, c, opts(urlF))
	slowErr := make(chan error, 1)
	t0 := time.Now()
	go func() {
		rc, err := csS.Fetch(ctx, b.Desc, 0, -1)
		if err == nil {
			rc.Close()
		}
		slowErr <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow store was never asked")
	}
	if got := storetest.ReadAll(t, csF, b.Desc, 0, -1); !bytes.Equal(got, b.Data) {
		t.Fatal("fast store: wrong bytes")
	}
	if d := time.Since(t0); d > 1500*time.Millisecond {
		t.Fatalf("the fast store's download took %s: it waited for the slow one", d)
	}
	select {
	case err := <-slowErr:
		// The slow store may lose the race to the fast one's commit and
		// then find the blob, which it also holds: either it is cut, or it
		// is served what it holds, but within the bound.
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("slow store: err = %v, want its deadline", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the trickling store was not cut at its deadline")
	}
	if d := time.Since(t0); d > 6*time.Second {
		t.Fatalf("slow download ended after %s, its bound is 2s", d)
	}
	// A blob only the trickling store has is cut, not served.
	only := blobN(24, 3000)
	w, _ := openT(t, "file://"+dirS+"/app")
	if err := w.Push(ctx, only.Desc, bytes.NewReader(only.Data)); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	if _, err := csS.Fetch(ctx, only.Desc, 0, -1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("trickled blob: err = %v, want its deadline", err)
	}
	if d := time.Since(t1); d < 2*time.Second || d > 6*time.Second {
		t.Fatalf("trickled blob cut after %s, want its 2s bound", d)
	}
}

// TestBlobsPruneKeepsOtherProcessLease: a shim evicting to cache_size
// (a commit over the limit) keeps the blobs that a running lazy sandbox of
// another process leased, not only `cryoctl gc` does.
func TestBlobsPruneKeepsOtherProcessLease(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	other, err := nodecache.Open(dir, nodecache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	leased, b2, b3 := blobN(31, 600), blobN(32, 600), blobN(33, 600)
	snap := digest.FromString("snapshot")
	release, err := other.Snapshots().Use(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if err := other.Snapshots().Lease(snap, []digest.Digest{leased.Desc.Digest}); err != nil {
		t.Fatal(err)
	}
	shim, err := nodecache.Open(dir, nodecache.Options{MaxBlobBytes: 1300})
	if err != nil {
		t.Fatal(err)
	}
	c, err := shim.Blobs()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []storetest.Blob{leased, b2, b3} {
		if err := c.Add(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
			t.Fatal(err)
		}
	}
	if !c.Has(leased.Desc.Digest) {
		t.Fatal("the shim evicted a blob another process's sandbox leased")
	}
	if _, err := os.Stat(filepath.Join(dir, "blobs", "blobs", "sha256", leased.Desc.Digest.Encoded())); err != nil {
		t.Fatal(err)
	}
	if c.Has(b2.Desc.Digest) || c.Stats().Bytes > 1300 {
		t.Fatalf("stats %+v: the unleased least recently used blob should have gone", c.Stats())
	}
	// Once the sandbox is gone, the lease binds nothing.
	release()
	if _, err := c.Prune(600); err != nil {
		t.Fatal(err)
	}
	if c.Has(leased.Desc.Digest) {
		t.Fatal("a lease outlived its sandbox")
	}

}
