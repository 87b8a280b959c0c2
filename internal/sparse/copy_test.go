package sparse

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// sparseSource writes a file of size bytes in dir holding data at each of
// offs, holes elsewhere.
func sparseSource(t *testing.T, dir string, size int64, data []byte, offs ...int64) string {
	t.Helper()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range offs {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

// copyChecked copies src with Copy to dir/dst, checks that the copy
// reads as the source, and returns its path.
func copyChecked(t *testing.T, dir, src string) string {
	t.Helper()
	dst := filepath.Join(dir, "dst")
	if err := Copy(dst, src, -1); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if len(a) != len(b) || !bytes.Equal(a, b) {
		t.Fatalf("copy differs from the source (%d bytes, want %d)", len(b), len(a))
	}
	return dst
}

func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	const size = 8 << 20
	data := bytes.Repeat([]byte("ram!"), 1024)
	src := sparseSource(t, dir, size, data, 0, 3<<20, size-int64(len(data)))
	dst := copyChecked(t, dir, src)
	var st unix.Stat_t
	if err := unix.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 >= size/2 {
		t.Fatalf("copy is not sparse: %d bytes allocated for %d", st.Blocks*512, size)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o600 {
		t.Fatalf("copy mode %v, want 0600: it holds guest memory", fi.Mode().Perm())
	}
	if err := Copy(dst, src, -1); err == nil {
		t.Fatal("Copy overwrote an existing file")
	}
}

// A data extent larger than a copy piece is split over the workers and
// lands whole, on the same offsets.
func TestCopySparseLargeExtents(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 3*copyPiece+12345)
	rand.Read(data)
	copyChecked(t, dir, sparseSource(t, dir, 64<<20, data, 4096, 40<<20))
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

// TestCopyDataIntoMemfd: CopyData fills an open, sized file (a memfd, as
// a shared RAM base is) with the source's data; the holes stay holes,
// taking no memory.
func TestCopyDataIntoMemfd(t *testing.T) {
	const size = 64 << 20
	data := make([]byte, 1<<20)
	rand.Read(data)
	src := sparseSource(t, t.TempDir(), size, data, 0, 40<<20)
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	fd, err := unix.MemfdCreate("sparse-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	out := os.NewFile(uintptr(fd), "memfd")
	defer out.Close()
	if err := out.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if err := CopyData(out, in, size); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src)
	got := make([]byte, size)
	if _, err := out.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the memfd does not read as the source (%v)", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if allocated := st.Blocks * 512; allocated > 4<<20 {
		t.Fatalf("the memfd allocates %d bytes for 2 MiB of data", allocated)
	}
}
