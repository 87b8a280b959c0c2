package devstate

import (
	"bufio"
	"fmt"
	"io"
)

// Page is one page record of the split RAM block, in stream order. A
// block's page may come more than once (a running VM's dirtied pages are
// sent again): the last one holds.
type Page struct {
	Off  int64  // offset in the block: page-aligned, below the block's length
	Data []byte // the page (PageSize bytes), valid only during the call; nil for a fill page
	Fill byte   // a fill page's byte (QEMU 7.2 sends only all-zero pages as fills)
}

// Stats says what Split read and wrote.
type Stats struct {
	BlockSize int64 // the split block's length, from ram's block list
	Pages     int64 // the block's page records handed to page, fills included
	FillPages int64 // how many of them were fills
	In, Out   int64 // bytes read from r, written to w
}

// Split copies the migration stream r to w without the page records of the
// RAM block named block, handing each of them to page (an error from page
// ends Split with it). The stream must be QEMU 7.2's precopy stream (see
// the package comment); anything Split cannot handle exactly is refused
// with errdefs.ErrInvalidArgument, naming what and where. Split reads r to
// its end. It allocates nothing by what the stream claims; the caller
// bounds the time and the sizes (an io.LimitReader on r, a limit on w).
func Split(r io.Reader, w io.Writer, block string, page func(Page) error) (Stats, error) {
	s := &splitter{
		in:     reader{r: bufio.NewReaderSize(r, readBufSize)},
		out:    writer{w: bufio.NewWriterSize(w, 64<<10)},
		block:  block,
		page:   page,
		target: -1,
		inLast: -1,
	}
	err := s.run()
	s.stats.In, s.stats.Out = s.in.pos, s.out.n
	if err != nil {
		return s.stats, fmt.Errorf("split ram block %q from device state: %w", block, err)
	}
	return s.stats, nil
}

// ramBlock is one entry of ram's block list.
type ramBlock struct {
	name   string
	length int64
}

// splitter is one Split: the stream's state as QEMU's loader tracks it.
type splitter struct {
	in    reader
	out   writer
	block string
	page  func(Page) error

	ignoreShared bool // the configuration announced x-ignore-shared
	ramID        uint32
	ramStarted   bool
	ramEnded     bool
	blocks       []ramBlock
	target       int // blocks index of the split block
	// The block a CONTINUE record means (ram_block_from_stream's
	// last_recv_block, kept across sections); -1 for none yet.
	inLast int

	stats Stats
}

func (s *splitter) run() error {
	if s.block == "" || len(s.block) > maxName {
		return s.in.refuse("block name %q: want 1 to %d bytes", s.block, maxName)
	}
	for _, step := range []func() error{s.fileHeader, s.configuration, s.ramSections, s.deviceSections} {
		if err := step(); err != nil {
			return err
		}
	}
	if err := s.out.w.Flush(); err != nil {
		return fmt.Errorf("write device state: %w", err)
	}
	return nil
}

// fileHeader is the magic and the version.
func (s *splitter) fileHeader() error {
	magic, err := s.in.be32("magic")
	if err != nil {
		return err
	}
	if magic != fileMagic {
		return s.in.refuse("magic %#08x: not a QEMU migration stream (want %#08x, QEVM)", magic, fileMagic)
	}
	version, err := s.in.be32("version")
	if err != nil {
		return err
	}
	if version != fileVersion {
		return s.in.refuse("stream version %d: want %d", version, fileVersion)
	}
	if err := s.out.be32(magic); err != nil {
		return err
	}
	return s.out.be32(version)
}

// deviceSections copies what follows ram's END section verbatim: the
// devices' FULL sections, EOF and the vmdesc JSON.
func (s *splitter) deviceSections() error {
	n, err := s.in.r.WriteTo(&s.out)
	s.in.pos += n
	if err != nil {
		return fmt.Errorf("copy device sections: %w", err)
	}
	return nil
}
