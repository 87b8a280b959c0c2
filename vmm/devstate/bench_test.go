package devstate

import (
	"bytes"
	"io"
	"os"
	"testing"
)

// BenchmarkSplit splits a synthetic stream of a 256 MiB block (three
// pages in four with data, one a fill) in sections of 4096 records, as
// QEMU's iterations send them; the callback only touches each page.
func BenchmarkSplit(b *testing.B) {
	const size = 256 << 20
	w := new(sw).header().ramStart(blk{"ram0", size}, blk{"pc.bios", 64 * PageSize})
	data := pageOf(9)
	for off := uint64(0); off < size; off += PageSize {
		if off%(4096*PageSize) == 0 {
			if off > 0 {
				w.eos().footer()
			}
			w.section(sectionPart).page("ram0", off, data)
			continue
		}
		if off/PageSize%4 == 3 {
			w.fill("", off, 0)
		} else {
			w.page("", off, data)
		}
	}
	w.eos().footer().section(sectionEnd)
	for off := uint64(0); off < 64*PageSize; off += PageSize {
		w.page("pc.bios", off, data)
	}
	w.eos().footer().devices()
	in := w.Bytes()
	var sum byte
	page := func(p Page) error {
		if p.Data != nil {
			sum += p.Data[0]
		}
		return nil
	}
	b.Run("memory", func(b *testing.B) {
		b.SetBytes(int64(len(in)))
		b.ReportAllocs()
		for b.Loop() {
			if st, err := Split(bytes.NewReader(in), io.Discard, "ram0", page); err != nil || st.Pages != size/PageSize {
				b.Fatalf("%+v %v", st, err)
			}
		}
	})
	// Through a pipe, as QEMU's migration reaches Split.
	b.Run("pipe", func(b *testing.B) {
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			pr, pw, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			go func() { pw.Write(in); pw.Close() }()
			st, err := Split(pr, io.Discard, "ram0", page)
			pr.Close()
			if err != nil || st.Pages != size/PageSize {
				b.Fatalf("%+v %v", st, err)
			}
		}
	})
}
