package devstate

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/containerd/errdefs"
)

var testBlocks = []blk{{"ram0", 8 * PageSize}, {"pc.bios", 4 * PageSize}, {"pc.rom", 2 * PageSize}}

// got is a page as handed to the callback, its data copied.
type got struct {
	off  int64
	data []byte
	fill byte
}

// split runs Split on in for block ram0, collecting the pages.
func split(t *testing.T, in []byte) ([]byte, []got, Stats, error) {
	t.Helper()
	var out bytes.Buffer
	var pages []got
	st, err := Split(bytes.NewReader(in), &out, "ram0", func(p Page) error {
		if p.Data != nil && len(p.Data) != PageSize {
			t.Fatalf("page %#x: %d bytes", p.Off, len(p.Data))
		}
		pages = append(pages, got{p.Off, bytes.Clone(p.Data), p.Fill})
		return nil
	})
	return out.Bytes(), pages, st, err
}

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in, want  *sw
		pages     []got
		fillPages int64
	}{{
		name: "pages and fills of the block out, other blocks kept",
		in: new(sw).header().ramStart(testBlocks...).
			section(sectionPart).page("ram0", 0, pageOf(1)).fill("", PageSize, 0).page("pc.bios", 0, pageOf(2)).fill("", PageSize, 0).eos().footer().
			section(sectionEnd).page("ram0", 3*PageSize, pageOf(3)).fill("", 2*PageSize, 0xab).eos().footer().devices(),
		want: new(sw).header().ramStart(testBlocks...).
			section(sectionPart).page("pc.bios", 0, pageOf(2)).fill("", PageSize, 0).eos().footer().
			section(sectionEnd).eos().footer().devices(),
		pages:     []got{{0, pageOf(1), 0}, {PageSize, nil, 0}, {3 * PageSize, pageOf(3), 0}, {2 * PageSize, nil, 0xab}},
		fillPages: 2,
	}, {
		name: "removed block continued across sections",
		in: new(sw).header().ramStart(testBlocks...).
			section(sectionPart).page("ram0", 0, pageOf(1)).eos().footer().
			section(sectionPart).page("", PageSize, pageOf(2)).eos().footer().
			section(sectionEnd).fill("", 7*PageSize, 0).eos().footer().devices(),
		want: new(sw).header().ramStart(testBlocks...).
			section(sectionPart).eos().footer().section(sectionPart).eos().footer().
			section(sectionEnd).eos().footer().devices(),
		pages:     []got{{0, pageOf(1), 0}, {PageSize, pageOf(2), 0}, {7 * PageSize, nil, 0}},
		fillPages: 1,
	}, {
		name: "kept block continued across sections",
		in: new(sw).header().ramStart(testBlocks...).
			section(sectionPart).page("pc.bios", 0, pageOf(1)).eos().footer().
			section(sectionEnd).page("", PageSize, pageOf(2)).eos().footer().devices(),
		want: new(sw).header().ramStart(testBlocks...).
			section(sectionPart).page("pc.bios", 0, pageOf(1)).eos().footer().
			section(sectionEnd).page("", PageSize, pageOf(2)).eos().footer().devices(),
	}, {
		name: "kept after removed, removed after kept",
		in: new(sw).header().ramStart(testBlocks...).
			section(sectionEnd).page("pc.bios", 0, pageOf(1)).fill("", PageSize, 0).
			page("ram0", 0, pageOf(2)).page("", PageSize, pageOf(3)).
			page("pc.rom", PageSize, pageOf(4)).page("ram0", 5*PageSize, pageOf(5)).
			page("pc.bios", 3*PageSize, pageOf(6)).eos().footer().devices(),
		want: new(sw).header().ramStart(testBlocks...).
			section(sectionEnd).page("pc.bios", 0, pageOf(1)).fill("", PageSize, 0).
			page("pc.rom", PageSize, pageOf(4)).page("pc.bios", 3*PageSize, pageOf(6)).eos().footer().devices(),
		pages: []got{{0, pageOf(2), 0}, {PageSize, pageOf(3), 0}, {5 * PageSize, pageOf(5), 0}},
	}, {
		name: "no x-ignore-shared: no guest addresses in the block list",
		in: (&sw{noAddr: true}).magic().config().ramStart(testBlocks...).
			section(sectionEnd).page("ram0", 0, pageOf(1)).eos().footer().devices(),
		want:  (&sw{noAddr: true}).magic().config().ramStart(testBlocks...).section(sectionEnd).eos().footer().devices(),
		pages: []got{{0, pageOf(1), 0}},
	}, {
		name: "every configuration subsection",
		in: func() *sw {
			w := new(sw).magic().config(capIgnoreShared, "some-other")
			w.u8(subsection).str(subTargetPageBits).be32(1).be32(12)
			w.u8(subsection).str(subUUID).be32(1).raw(bytes.Repeat([]byte{7}, 16))
			return w.ramStart(testBlocks...).section(sectionEnd).eos().footer()
		}(),
		want: func() *sw {
			w := new(sw).magic().config(capIgnoreShared, "some-other")
			w.u8(subsection).str(subTargetPageBits).be32(1).be32(12)
			w.u8(subsection).str(subUUID).be32(1).raw(bytes.Repeat([]byte{7}, 16))
			return w.ramStart(testBlocks...).section(sectionEnd).eos().footer()
		}(),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			out, pages, st, err := split(t, tc.in.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, tc.want.Bytes()) {
				t.Fatalf("output differs at byte %d of %d (want %d bytes)", firstDiffAt(out, tc.want.Bytes()), len(out), tc.want.Len())
			}
			if len(pages) != len(tc.pages) {
				t.Fatalf("%d pages, want %d", len(pages), len(tc.pages))
			}
			for i, p := range pages {
				w := tc.pages[i]
				if p.off != w.off || !bytes.Equal(p.data, w.data) || p.fill != w.fill {
					t.Fatalf("page %d: off %#x fill %#x data %v, want off %#x fill %#x data %v", i, p.off, p.fill, p.data != nil, w.off, w.fill, w.data != nil)
				}
			}
			want := Stats{BlockSize: 8 * PageSize, Pages: int64(len(tc.pages)), FillPages: tc.fillPages, In: int64(tc.in.Len()), Out: int64(tc.want.Len())}
			if st != want {
				t.Fatalf("stats %+v, want %+v", st, want)
			}
		})
	}
}

func firstDiffAt(a, b []byte) int {
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// TestSplitPageError ends Split with the callback's error.
func TestSplitPageError(t *testing.T) {
	in := new(sw).header().ramStart(testBlocks...).section(sectionEnd).page("ram0", PageSize, pageOf(1)).eos().footer().devices()
	stop := errors.New("stop")
	_, err := Split(bytes.NewReader(in.Bytes()), io.Discard, "ram0", func(Page) error { return stop })
	if !errors.Is(err, stop) {
		t.Fatalf("got %v, want the callback's error", err)
	}
}

// TestSplitTruncated refuses every prefix of a stream that ends before
// ram's END section does.
func TestSplitTruncated(t *testing.T) {
	head := new(sw).header().ramStart(testBlocks...).
		section(sectionPart).page("ram0", 0, pageOf(1)).fill("", PageSize, 0).page("pc.bios", 0, pageOf(2)).eos().footer().
		section(sectionEnd).page("", PageSize, pageOf(3)).eos().footer()
	in := head.Bytes()
	for n := 0; n < len(in); n++ {
		_, _, _, err := split(t, in[:n])
		if !errors.Is(err, io.ErrUnexpectedEOF) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("stream cut at %d of %d bytes: got %v, want a truncated stream", n, len(in), err)
		}
	}
	if _, _, _, err := split(t, in); err != nil {
		t.Fatalf("whole stream: %v", err)
	}
}
