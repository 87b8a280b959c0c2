package pagefs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// zeroSource is a base of size bytes of zeros: a booted guest's RAM.
type zeroSource int64

func (z zeroSource) Size() int64 { return int64(z) }

func (z zeroSource) ReadAt(p []byte, off int64) (int, error) {
	clear(p)
	return len(p), nil
}

// BenchmarkSeal measures Seal, the only part of a checkpoint of served RAM
// that runs in the pause, on files of growing size with the same dirty set
// (64 MiB spread over the whole file, so every word of a bitmap is
// touched). Its ns/op is Seal's alone; list-ns/op is the generation's
// first Pages, which runs after the guest resumed. Writing the dirty set
// and closing the previous generation are not counted.
func BenchmarkSeal(b *testing.B) {
	const dirty = 64 << 20
	for _, size := range []int64{256 << 20, 1 << 30, 4 << 30, 16 << 30} {
		b.Run(fmt.Sprintf("size=%dMiB", size>>20), func(b *testing.B) {
			f, side := sealBenchFile(b, size)
			stride := size / PageSize / (dirty / PageSize)
			page := make([]byte, PageSize)
			var sealed, listed time.Duration
			for b.Loop() {
				for pg := int64(0); pg < size/PageSize; pg += stride {
					if _, err := f.WriteAt(page, pg*PageSize); err != nil {
						b.Fatal(err)
					}
				}
				t0 := time.Now()
				g, err := f.Seal(side)
				sealed += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				t0 = time.Now()
				n := len(g.Pages())
				listed += time.Since(t0)
				if n != dirty/PageSize {
					b.Fatalf("%d pages sealed, want %d", n, dirty/PageSize)
				}
				g.Close()
			}
			b.ReportMetric(float64(sealed.Nanoseconds())/float64(b.N), "ns/op")
			b.ReportMetric(float64(listed.Nanoseconds())/float64(b.N), "list-ns/op")
		})
	}
}

// sealBenchFile is a layered file of size over zeros, its layer and side
// sparse files in a temporary directory.
func sealBenchFile(b *testing.B, size int64) (*File, *os.File) {
	b.Helper()
	dir := b.TempDir()
	layer, err := os.Create(filepath.Join(dir, "layer"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { layer.Close() })
	if err := layer.Truncate(size); err != nil {
		b.Fatal(err)
	}
	f, err := NewLayered("ram", zeroSource(size), layer)
	if err != nil {
		b.Fatal(err)
	}
	side, err := os.Create(filepath.Join(dir, "side"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { side.Close() })
	return f, side
}
