package snapshot

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/containerd/errdefs"
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
