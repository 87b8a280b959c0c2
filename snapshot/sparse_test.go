package snapshot

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// writeSparse writes exactly the data pages, in runs, and the file reads
// back equal to the chunk; all-zero pages stay holes.
func TestWriteSparse(t *testing.T) {
	b := make([]byte, 16*PageSize+100) // the last page is short
	for _, p := range []int{1, 2, 5, 9, 10, 11, 16} {
		b[p*PageSize+7] = byte(p)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const off = 1 << 20
	if err := f.Truncate(off + int64(len(b))); err != nil {
		t.Fatal(err)
	}
	var calls [][2]int64
	write := func(w writerAt, p []byte, o int64) (int, error) {
		calls = append(calls, [2]int64{o - off, int64(len(p))})
		return w.WriteAt(p, o)
	}
	if err := writeSparse(write, f, b, off); err != nil {
		t.Fatal(err)
	}
	want := [][2]int64{{1 * PageSize, 2 * PageSize}, {5 * PageSize, PageSize}, {9 * PageSize, 3 * PageSize}, {16 * PageSize, 100}}
	if len(calls) != len(want) {
		t.Fatalf("writes %v, want %v", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Fatalf("writes %v, want %v", calls, want)
		}
	}
	got := make([]byte, len(b))
	if _, err := f.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, b) {
		t.Fatal("file differs from the chunk")
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 8*PageSize {
		t.Fatalf("%d bytes allocated for 7 data pages: zero pages were written", st.Blocks*512)
	}
}
