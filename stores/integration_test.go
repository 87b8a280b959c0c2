//go:build integration

package stores_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

func envOpts(env map[string]string) stores.Options {
	return stores.Options{Getenv: func(k string) string { return env[k] }, RetryBackoff: 10 * time.Millisecond}
}

func openEnv(t *testing.T, url string, env map[string]string) stores.Store {
	t.Helper()
	s, _, err := stores.Open(context.Background(), url, envOpts(env))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestIntegrationS3Store(t *testing.T) {
	srv := storetest.StartS3(t)
	t.Run("s3", func(t *testing.T) {
		storetest.RunStoreSuite(t, openEnv(t, "s3://"+srv.Bucket+"/team/app:v1", srv.Env("S3")))
	})
	t.Run("minio-env-bucket-and-prefix", func(t *testing.T) {
		env := srv.Env("MINIO")
		env["STORAGE_MINIO_PREFIX"] = "envprefix"
		storetest.RunStoreSuite(t, openEnv(t, "minio:///app:v1", env))
		// The objects are where the documented layout says.
		c := srv.Client(t)
		if _, err := c.StatObject(context.Background(), srv.Bucket, "envprefix/refs/app/v1", minioStat()); err != nil {
			t.Fatalf("reference object: %v", err)
		}
	})
	t.Run("clear-errors", func(t *testing.T) {
		ctx := context.Background()
		b := storetest.NewBlob("application/octet-stream", []byte("x"))
		s := openEnv(t, "s3://no-such-bucket/app", srv.Env("S3"))
		err := s.Push(ctx, b.Desc, bytes.NewReader(b.Data))
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "bucket no-such-bucket does not exist") {
			t.Fatalf("push to a missing bucket: %v", err)
		}
		env := srv.Env("S3")
		env["STORAGE_S3_SECRET_ACCESS_KEY"] = "wrong"
		start := time.Now()
		_, err = openEnv(t, "s3://"+srv.Bucket+"/app", env).Exists(ctx, b.Desc)
		if !errdefs.IsPermissionDenied(err) || time.Since(start) > 2*time.Second {
			t.Fatalf("wrong secret: %v after %s, want permission denied at once (no retries)", err, time.Since(start))
		}
	})
	t.Run("names-share-blobs-and-gc", func(t *testing.T) {
		env := srv.Env("S3")
		a := openEnv(t, "s3://"+srv.Bucket+"/gc/a", env)
		b := openEnv(t, "s3://"+srv.Bucket+"/gc/b", env)
		fa, fb := storetest.NewFixture("v1", 10), storetest.NewFixture("v1", 11)
		storetest.Seed(t, a, fa)
		storetest.Seed(t, b, fb)
		// b sees a's blobs: one pool per prefix.
		if ok, err := b.Exists(context.Background(), fa.Layers[0].Desc); err != nil || !ok {
			t.Fatalf("blob pool not shared: %v, %v", ok, err)
		}
		orphan := storetest.NewBlob("application/octet-stream", []byte("orphan"))
		if err := a.Push(context.Background(), orphan.Desc, bytes.NewReader(orphan.Data)); err != nil {
			t.Fatal(err)
		}
		// Young orphans survive (a publish may be in progress) ...
		res, err := stores.GC(context.Background(), a, stores.GCOptions{})
		if err != nil || res.Deleted != 0 || res.Kept != 1 || res.Reachable != 8 {
			t.Fatalf("gc = %+v, %v", res, err)
		}
		// ... old ones go, and everything either name reaches stays.
		if err := b.Untag(context.Background(), "v1"); err != nil {
			t.Fatal(err)
		}
		res, err = stores.GC(context.Background(), a, stores.GCOptions{Grace: -time.Hour})
		if err != nil || res.Deleted != 5 || res.Reachable != 4 {
			t.Fatalf("gc = %+v, %v; want fb's 4 blobs and the orphan deleted", res, err)
		}
		storetest.CheckRead(t, a, fa)
	})
	t.Run("downloaded-once-per-node", func(t *testing.T) {
		s := openEnv(t, "s3://"+srv.Bucket+"/team/once:v1", srv.Env("S3"))
		f := storetest.NewFixture("v1", 20)
		storetest.Seed(t, s, f)
		c, err := nodecache.OpenBlobs(t.TempDir(), 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		// Two restores on one node: two stores of one URL, one cache. The
		// cache shares what a store has confirmed only with that store (its
		// StoreID): an anonymous store would download on its own.
		var wg sync.WaitGroup
		url := "s3://" + srv.Bucket + "/team/once"
		for i := range 2 {
			cs := nodecache.NewCachingStore(openEnv(t, url, srv.Env("S3")), c, nodecache.CachingOptions{PartSize: 1 << 20, StoreID: nodecache.StoreID(url)})
			wg.Go(func() {
				for _, b := range f.All() {
					if got := storetest.ReadAll(t, cs, b.Desc, 0, -1); !bytes.Equal(got, b.Data) {
						t.Errorf("store %d: blob %s differs", i, b.Desc.Digest)
					}
				}
			})
		}
		wg.Wait()
		var total int64
		for _, b := range f.All() {
			total += b.Desc.Size
		}
		st := c.Stats()
		if st.BytesDownloaded != total || st.Downloads != 4 || st.Hits+st.SharedDownloads != 4 {
			t.Fatalf("stats = %+v; want %d bytes in 4 downloads", st, total)
		}
	})
}

func TestIntegrationRegistryStore(t *testing.T) {
	addr := storetest.StartRegistry(t)
	s := openEnv(t, "oci://"+addr+"/cryo/app:v1", nil)
	storetest.RunStoreSuite(t, s)

	t.Run("cached-ranged-parts", func(t *testing.T) {
		s := openEnv(t, "oci://"+addr+"/cryo/parts", nil)
		f := storetest.NewFixture("v1", 30)
		storetest.Seed(t, s, f)
		c, err := nodecache.OpenBlobs(t.TempDir(), 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		cs := nodecache.NewCachingStore(s, c, nodecache.CachingOptions{PartSize: 512 << 10})
		big := f.Layers[0]
		if got := storetest.ReadAll(t, cs, big.Desc, 7, 1<<20); !bytes.Equal(got, big.Data[7:7+1<<20]) {
			t.Fatal("ranged read through the cache differs")
		}
		if tags, err := s.Tags(context.Background()); err != nil || !slices.Equal(tags, []string{"v1"}) {
			t.Fatalf("tags = %v, %v", tags, err)
		}
	})
}
