package shim

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
)

// A data extent larger than a copy piece is split over the workers and
// lands whole, on the same offsets.
func TestCopySparseLargeExtents(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	const size = 64 << 20
	data := make([]byte, 3*copyPiece+12345)
	rand.Read(data)
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{4096, 40 << 20} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	dst := filepath.Join(dir, "dst")
	if err := copySparse(dst, src); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if len(b) != size || !bytes.Equal(a, b) {
		t.Fatalf("copy differs from the source (%d bytes, want %d)", len(b), size)
	}
}

// The pread/pwrite fallback copies a range exactly and refuses a source
// that is shorter than the range.
func TestPreadPwrite(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 3<<20+7)
	rand.Read(data)
	in, err := os.Create(filepath.Join(dir, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	in.Write(data)
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var buf []byte
	if err := preadPwrite(in, out, 5, int64(len(data))-5, &buf); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	n, _ := out.ReadAt(got, 0)
	if n != len(data) || !bytes.Equal(got[5:], data[5:]) {
		t.Fatalf("copied %d bytes, or content differs", n)
	}
	if err := preadPwrite(in, out, int64(len(data))-10, 20, &buf); err == nil {
		t.Fatal("copy past the end of the source succeeded")
	}
}
