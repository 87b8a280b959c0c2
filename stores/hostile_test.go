package stores_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

// hostile serves one blob at /blobs/sha256/<hex> (with Range support); act
// decides, per request number (from 1), how to misbehave. It returns false
// to serve the request normally.
type hostile struct {
	blob     storetest.Blob
	requests atomic.Int64
	act      func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool
}

func (h *hostile) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.requests.Add(1)
	if r.URL.Path != "/blobs/sha256/"+h.blob.Desc.Digest.Encoded() {
		http.NotFound(w, r)
		return
	}
	start, end := int64(0), int64(len(h.blob.Data))
	if rg := r.Header.Get("Range"); rg != "" {
		spec := strings.TrimPrefix(rg, "bytes=")
		a, b, _ := strings.Cut(spec, "-")
		start, _ = strconv.ParseInt(a, 10, 64)
		if b != "" {
			e, _ := strconv.ParseInt(b, 10, 64)
			end = e + 1
		}
	}
	if h.act != nil && h.act(n, w, r, start, end) {
		return
	}
	serveRange(w, h.blob.Data, start, end, r.Header.Get("Range") != "")
}

func serveRange(w http.ResponseWriter, data []byte, start, end int64, ranged bool) {
	w.Header().Set("Content-Length", strconv.FormatInt(end-start, 10))
	if ranged {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end-1, len(data)))
		w.WriteHeader(http.StatusPartialContent)
	}
	w.Write(data[start:end])
}

// breakAfter sends the headers and half of the range, then cuts the
// connection.
func breakAfter(w http.ResponseWriter, data []byte, start, end int64) {
	w.Header().Set("Content-Length", strconv.FormatInt(end-start, 10))
	w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end-1, len(data)))
	w.WriteHeader(http.StatusPartialContent)
	w.Write(data[start : start+(end-start)/2])
	w.(http.Flusher).Flush()
	panic(http.ErrAbortHandler)
}

func fastOpts() stores.Options {
	return stores.Options{
		Retries: 3, RetryBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		StallTimeout: 300 * time.Millisecond, Getenv: func(string) string { return "" },
	}
}

func newHostile(size int) *hostile {
	return &hostile{blob: storetest.NewBlob("application/octet-stream", storetest.RandomBytes(uint64(size), size))}
}

func (h *hostile) ServeLayout() http.Handler {
	return http.StripPrefix("/layout", h)
}

func startHostileLayout(t *testing.T, h *hostile) stores.Store {
	t.Helper()
	srv := httptest.NewServer(h.ServeLayout())
	t.Cleanup(srv.Close)
	s, _, err := stores.Open(context.Background(), srv.URL+"/layout", fastOpts())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func fetchErr(s stores.Store, d ocispec.Descriptor) ([]byte, error) {
	rc, err := s.Fetch(context.Background(), d, 0, -1)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func TestHostile503MidStreamRetried(t *testing.T) {
	h := newHostile(1 << 20)
	h.act = func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool {
		switch n {
		case 1:
			breakAfter(w, h.blob.Data, start, end)
		case 2, 3:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			return false
		}
		return true
	}
	s := startHostileLayout(t, h)
	got, err := fetchErr(s, h.blob.Desc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, h.blob.Data) {
		t.Fatal("content differs after resuming")
	}
	if n := h.requests.Load(); n != 4 {
		t.Fatalf("%d requests, want 4 (cut, 503, 503, resume)", n)
	}
}

func TestHostile503GivesUp(t *testing.T) {
	h := newHostile(1000)
	h.act = func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	}
	s := startHostileLayout(t, h)
	_, err := fetchErr(s, h.blob.Desc)
	if err == nil || !strings.Contains(err.Error(), "giving up after 4 attempts") || !errdefs.IsUnavailable(err) {
		t.Fatalf("err = %v, want giving up after 4 attempts, unavailable", err)
	}
}

func TestHostileNotFoundNotRetried(t *testing.T) {
	h := newHostile(1000)
	s := startHostileLayout(t, h)
	missing := storetest.NewBlob("application/octet-stream", []byte("x"))
	if _, err := fetchErr(s, missing.Desc); !errdefs.IsNotFound(err) {
		t.Fatalf("err = %v, want not found", err)
	}
	h.act = func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool {
		w.WriteHeader(http.StatusForbidden)
		return true
	}
	if _, err := fetchErr(s, h.blob.Desc); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("err = %v, want permission denied", err)
	}
	if n := h.requests.Load(); n != 2 {
		t.Fatalf("%d requests, want 2: 404 and 403 are not retried", n)
	}
}

func TestHostileStallCutAndRetried(t *testing.T) {
	h := newHostile(256 << 10)
	h.act = func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool {
		if n != 1 {
			return false
		}
		w.Header().Set("Content-Length", strconv.FormatInt(end-start, 10))
		w.WriteHeader(http.StatusOK)
		w.Write(h.blob.Data[:1000])
		w.(http.Flusher).Flush()
		select { // stall until the client gives up on us
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return true
	}
	s := startHostileLayout(t, h)
	start := time.Now()
	got, err := fetchErr(s, h.blob.Desc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, h.blob.Data) {
		t.Fatal("content differs after a stall")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s: the stall was not cut", d)
	}
	if n := h.requests.Load(); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
}

func TestHostileStallGivesUp(t *testing.T) {
	h := newHostile(1000)
	h.act = func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool {
		<-r.Context().Done() // never answers
		return true
	}
	s := startHostileLayout(t, h)
	_, err := fetchErr(s, h.blob.Desc)
	if err == nil || !strings.Contains(err.Error(), "no data for") {
		t.Fatalf("err = %v, want a stall error", err)
	}
}

// newCachingStore returns a caching store over s with a small part size, and
// its cache directory.
func newCachingStore(t *testing.T, s stores.Store, partSize int64) (*nodecache.CachingStore, string) {
	t.Helper()
	dir := t.TempDir()
	c, err := nodecache.OpenBlobs(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return nodecache.NewCachingStore(s, c, nodecache.CachingOptions{PartSize: partSize, Parallel: 3}), dir
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

func TestHostileObjectChangesBetweenRangedReads(t *testing.T) {
	h := newHostile(1 << 20)
	other := storetest.RandomBytes(42, len(h.blob.Data)) // same size, other content
	h.act = func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool {
		if start == 0 {
			return false // the first part comes from the original
		}
		serveRange(w, other, start, end, true)
		return true
	}
	cs, dir := newCachingStore(t, startHostileLayout(t, h), 256<<10)
	err := cs.Ensure(context.Background(), h.blob.Desc)
	if !errors.Is(err, stores.ErrDigestMismatch) || !errdefs.IsDataLoss(err) {
		t.Fatalf("err = %v, want a digest mismatch", err)
	}
	if n := h.requests.Load(); n != 4 {
		t.Fatalf("%d requests, want 4 ranged parts", n)
	}
	assertCacheEmpty(t, dir)
}

func TestHostileObjectChangesAfterResume(t *testing.T) {
	h := newHostile(1 << 20)
	other := storetest.RandomBytes(43, len(h.blob.Data))
	h.act = func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool {
		if n == 1 {
			breakAfter(w, h.blob.Data, start, end)
		} else {
			serveRange(w, other, start, end, true)
		}
		return true
	}
	cs, dir := newCachingStore(t, startHostileLayout(t, h), 16<<20)
	if err := cs.Ensure(context.Background(), h.blob.Desc); !errors.Is(err, stores.ErrDigestMismatch) {
		t.Fatalf("err = %v, want a digest mismatch", err)
	}
	assertCacheEmpty(t, dir)
}

func TestHostileTruncated(t *testing.T) {
	h := newHostile(100 << 10)
	short := h.blob.Data[:len(h.blob.Data)-10] // the store's object lost its tail
	h.act = func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool {
		if start >= int64(len(short)) {
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return true
		}
		serveRange(w, short, start, min(end, int64(len(short))), r.Header.Get("Range") != "")
		return true
	}
	for _, part := range []int64{16 << 20, 32 << 10} {
		cs, dir := newCachingStore(t, startHostileLayout(t, h), part)
		err := cs.Ensure(context.Background(), h.blob.Desc)
		if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "ends at 102390") {
			t.Fatalf("part %d: err = %v, want a truncation error", part, err)
		}
		assertCacheEmpty(t, dir)
	}
}

func TestHostileExtraBytes(t *testing.T) {
	for _, part := range []int64{16 << 20, 32 << 10} { // one stream, and parts
		h := newHostile(100 << 10)
		padded := append(bytes.Clone(h.blob.Data), []byte("trailing junk")...)
		h.act = func(n int64, w http.ResponseWriter, r *http.Request, start, end int64) bool {
			if r.Header.Get("Range") == "" || end == int64(len(h.blob.Data)) {
				end = int64(len(padded))
			}
			serveRange(w, padded, start, end, r.Header.Get("Range") != "")
			return true
		}
		cs, dir := newCachingStore(t, startHostileLayout(t, h), part)
		err := cs.Ensure(context.Background(), h.blob.Desc)
		if !errors.Is(err, stores.ErrDigestMismatch) || !strings.Contains(err.Error(), "more than") {
			t.Fatalf("part %d: err = %v, want extra bytes refused", part, err)
		}
		assertCacheEmpty(t, dir)
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
	if cs.Blobs().Has(h.blob.Desc.Digest) {
		t.Fatal("cancelled download entered the cache")
	}
}
