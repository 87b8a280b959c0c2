//go:build integration

package snapshot

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

// TestRealStores writes a signed, encrypted snapshot to every store kind
// (OCI layout, S3 on versitygw, the distribution registry, and the layout
// read back over HTTP), then opens it with signature and encryption
// required, materializes it and checks the bytes; a second snapshot after
// a small change uploads only the changed chunks.
func TestRealStores(t *testing.T) {
	keyDir := t.TempDir()
	if err := GenerateSigningKey(filepath.Join(keyDir, "k.pem"), filepath.Join(keyDir, "k.pub")); err != nil {
		t.Fatal(err)
	}
	sk, _ := LoadSigningKey(filepath.Join(keyDir, "k.pem"))
	pk, _ := LoadPublicKey(filepath.Join(keyDir, "k.pub"))
	encKey := bytes.Repeat([]byte{3}, 32)

	layout := t.TempDir()
	s3 := storetest.StartS3(t)
	reg := storetest.StartRegistry(t)
	env := s3.Env("S3")
	opts := stores.Options{Getenv: func(k string) string { return env[k] }, Retries: 1}

	for _, tc := range []struct{ name, writeURL, readURL string }{
		{"file", "file://" + layout + "/snaps/web", ""},
		{"s3", "s3://" + s3.Bucket + "/cryo/web", ""},
		{"oci", "oci://" + reg + "/cryo/web", ""},
		{"http", "file://" + layout + "/http/web", "http-of:" + layout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			ws, _, err := stores.Open(ctx, tc.writeURL+":v1", opts)
			if err != nil {
				t.Fatal(err)
			}
			ts := newTestSnap(t)
			src, err := NewSource(ts.md, ts.paths)
			if err != nil {
				t.Fatal(err)
			}
			// Both writes are one chain (one lineage): the chunks the
			// second shares with the first are sealed alike and skipped.
			wo := WriteOptions{ChunkSize: testCS, EncryptionKey: encKey, SigningKey: sk, Lineage: NewLineage()}
			_, first, err := Write(ctx, ws, "v1", src, wo)
			src.Close()
			if err != nil {
				t.Fatalf("write: %v", err)
			}
			rs := ws
			if strings.HasPrefix(tc.readURL, "http-of:") {
				base := storetest.ServeDir(t, layout)
				if rs, _, err = stores.Open(ctx, base+"/http/web:v1", opts); err != nil {
					t.Fatal(err)
				}
			}
			ro := ReadOptions{PublicKey: pk, RequireSignature: true, DecryptionKey: encKey, RequireEncryption: true}
			s, err := Open(ctx, rs, "v1", ro)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			if !s.Signed {
				t.Fatal("not signed")
			}
			m, err := s.Materialize(ctx, nodecache.OpenSnapshots(t.TempDir()))
			if err != nil {
				t.Fatalf("materialize: %v", err)
			}
			ts.checkFiles(t, m)

			// The signature does not verify with another key, and a
			// pinned digest finds the same signature.
			other, _, _ := ed25519.GenerateKey(nil)
			if _, err := Open(ctx, rs, "v1", ReadOptions{PublicKey: other, RequireSignature: true}); !errdefs.IsUnauthorized(err) {
				t.Errorf("other key: %v", err)
			}
			if _, err := Open(ctx, rs, "v1@"+s.Descriptor.Digest.String(), ro); err != nil {
				t.Errorf("pinned: %v", err)
			}

			if tc.name == "http" {
				return
			}
			// Incremental: change one stored chunk of RAM.
			writeAtPath(t, ts.paths.RAM, []byte("changed"), 100)
			src, err = NewSource(ts.md, ts.paths)
			if err != nil {
				t.Fatal(err)
			}
			_, second, err := Write(ctx, ws, "v2", src, wo)
			src.Close()
			if err != nil {
				t.Fatalf("second write: %v", err)
			}
			if second.UploadedChunks != 1 || second.SkippedChunks != first.Chunks-1 {
				t.Errorf("second write uploaded %d chunks, skipped %d (of %d)", second.UploadedChunks, second.SkippedChunks, first.Chunks)
			}
		})
	}
}

func writeAtPath(t testing.TB, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
