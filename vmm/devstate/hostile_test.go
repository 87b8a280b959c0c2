package devstate

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// started is a valid stream up to ram's first PART section's records.
func started() *sw { return new(sw).header().ramStart(testBlocks...).section(sectionPart) }

// TestSplitRefuses is a table of streams Split cannot handle exactly, each
// refused with errdefs.ErrInvalidArgument and a message naming what.
func TestSplitRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   *sw
		want string
	}{
		{"bad magic", new(sw).be32(0x12345678).be32(3), "magic"},
		{"old version", new(sw).be32(fileMagic).be32(2), "stream version 2"},
		{"no configuration", new(sw).magic().u8(sectionStart), "want the configuration"},
		{"empty machine type", new(sw).magic().u8(configuration).be32(0), "machine type length 0"},
		{"long machine type", new(sw).magic().u8(configuration).be32(256), "machine type length 256"},
		{"huge machine type", new(sw).magic().u8(configuration).be32(0xffffffff), "machine type length 4294967295"},
		{"unknown subsection", new(sw).magic().config().u8(subsection).str("configuration/other").be32(1), `subsection "configuration/other"`},
		{"subsection version", new(sw).magic().config().u8(subsection).str(subUUID).be32(2), "version 2"},
		{"target page bits", new(sw).magic().config().u8(subsection).str(subTargetPageBits).be32(1).be32(16), "target page bits 16"},
		{"capability count", new(sw).magic().config().u8(subsection).str(subCapabilities).be32(1).be32(1 << 30), "capability count 1073741824"},
		{"empty capability", new(sw).magic().config().u8(subsection).str(subCapabilities).be32(1).be32(1).u8(0), "capability: empty"},

		{"device section before ram's end", new(sw).header().ramStart(testBlocks...).u8(sectionFull), "section type 0x04"},
		{"eof before ram's end", new(sw).header().ramStart(testBlocks...).u8(sectionEOF), "section type 0x00"},
		{"command before ram", new(sw).header().u8(command), "command section"},
		{"other iterable section", new(sw).header().startHeader("block", 0, 1), `start section "block"`},
		{"ram version", new(sw).header().startHeader("ram", 0, 3), "ram instance 0 version 3"},
		{"ram instance", new(sw).header().startHeader("ram", 1, 4), "ram instance 1"},
		{"second start", new(sw).header().ramStart(testBlocks...).ramStart(testBlocks...), "second start section"},
		{"part before start", new(sw).header().section(sectionPart), "not ram's"},
		{"part of another section", new(sw).header().ramStart(testBlocks...).u8(sectionPart).be32(testRAMID + 1), "section 3"},

		{"start without block list", new(sw).header().startHeader("ram", 0, 4).be64(flagEOS), "want the block list"},
		{"block length unaligned", new(sw).header().startHeader("ram", 0, 4).be64(PageSize | flagMemSize).str("ram0").be64(100), `block "ram0" length 100`},
		{"block length over total", new(sw).header().startHeader("ram", 0, 4).be64(PageSize | flagMemSize).str("ram0").be64(2 * PageSize), "at most the 4096 bytes left"},
		{"empty block name", new(sw).header().startHeader("ram", 0, 4).be64(PageSize | flagMemSize).u8(0), "block name: empty"},
		{"block listed twice", new(sw).header().ramStart(blk{"ram0", PageSize}, blk{"ram0", PageSize}), "listed twice"},
		{"too many blocks", new(sw).header().ramStart(manyBlocks(maxBlocks + 1)...), "over 1024 blocks"},
		{"block not listed", new(sw).header().ramStart(blk{"pc.bios", PageSize}), `block "ram0": not in the stream's block list`},
		{"no end after block list", func() *sw {
			w := new(sw).header().startHeader("ram", 0, 4).be64(PageSize | flagMemSize).str("ram0").be64(PageSize).be64(0)
			return w.page("ram0", 0, pageOf(0))
		}(), "want the end of section"},

		{"xbzrle page", started().be64(flagXBZRLE).str("ram0"), "XBZRLE page"},
		{"compressed page", started().be64(flagCompress).str("ram0"), "compressed page"},
		{"rdma hook", started().be64(flagHook), "RDMA hook"},
		{"block list in a part", started().be64(flagMemSize), "block list outside"},
		{"unknown flag", started().be64(0x1), "flags 0x1: unknown"},
		{"page and zero", started().be64(flagPage | flagZero).str("ram0"), "flags 0xa: unknown"},
		{"unaligned offset", started().be64(0x800 | flagPage).str("ram0"), "flags 0x808: unknown"},
		{"end with offset", started().be64(PageSize | flagEOS), "offset bits set"},
		{"unknown block", started().page("vga.vram", 0, pageOf(0)), `page of block "vga.vram"`},
		{"empty record block", started().be64(flagPage).u8(0), "block name: empty"},
		{"continue first", started().page("", 0, pageOf(0)), "continued page record before any named one"},
		{"offset outside the block", started().page("ram0", 8*PageSize, pageOf(0)), "page offset 0x8000 of block \"ram0\""},
		{"offset outside a kept block", started().fill("pc.rom", 2*PageSize, 0), "page offset 0x2000 of block \"pc.rom\""},
		{"continued offset outside", started().page("ram0", 0, pageOf(0)).fill("", 1<<40, 0), "page offset 0x10000000000"},

		{"footer marker", started().eos().u8(0x7f), "footer marker 0x7f"},
		{"footer id", started().eos().u8(footer).be32(testRAMID + 1), "footer id 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := split(t, tc.in.Bytes())
			if !errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("got %v, want a refusal (not a truncation)", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %q, want it to name %q", err, tc.want)
			}
		})
	}
}

// manyBlocks are n one-page blocks, the last of them ram0.
func manyBlocks(n int) []blk {
	bs := make([]blk, n)
	for i := range bs {
		bs[i] = blk{"b" + strconv.Itoa(i), PageSize}
	}
	bs[n-1].name = "ram0"
	return bs
}

// TestSplitBlockName refuses a block name QEMU cannot have.
func TestSplitBlockName(t *testing.T) {
	in := new(sw).header().ramStart(testBlocks...).Bytes()
	for _, name := range []string{"", strings.Repeat("r", maxName+1)} {
		_, err := Split(bytes.NewReader(in), io.Discard, name, func(Page) error { return nil })
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "block name") {
			t.Fatalf("block %q: got %v, want a refused block name", name, err)
		}
	}
}
