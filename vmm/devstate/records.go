package devstate

import "fmt"

// records reads the page records of one of ram's sections up to its EOS,
// removing the split block's and keeping the others'.
func (s *splitter) records() error {
	for {
		hdr, err := s.in.be64("ram record")
		if err != nil {
			return err
		}
		flags, off := hdr&flagMask, hdr&^flagMask
		if flags == flagEOS {
			if off != 0 {
				return s.in.refuse("end of section record %#x: offset bits set", hdr)
			}
			return s.out.be64(hdr)
		}
		if err := s.checkFlags(flags); err != nil {
			return err
		}
		b, err := s.recordBlock(flags)
		if err != nil {
			return err
		}
		if off >= uint64(s.blocks[b].length) {
			return s.in.refuse("page offset %#x of block %q: outside its %d bytes", off, s.blocks[b].name, s.blocks[b].length)
		}
		if b == s.target {
			err = s.extract(flags, int64(off))
		} else {
			err = s.keep(hdr, b)
		}
		if err != nil {
			return err
		}
	}
}

// checkFlags accepts a page (PAGE) or a fill page (ZERO), either with or
// without CONTINUE. The loader reads the flags from the bits below the
// target page, so an unaligned offset is an unknown flag.
func (s *splitter) checkFlags(flags uint64) error {
	switch flags &^ flagContinue {
	case flagPage, flagZero:
		return nil
	case flagXBZRLE:
		return s.in.refuse("XBZRLE page (capability xbzrle): not supported")
	case flagCompress:
		return s.in.refuse("compressed page (capability compress): not supported")
	case flagHook:
		return s.in.refuse("RDMA hook record: not supported")
	case flagMemSize:
		return s.in.refuse("block list outside ram's start section")
	}
	return s.in.refuse("ram record flags %#x: unknown", flags)
}

// recordBlock returns the block of a record: named by the record, or the
// previous record's (CONTINUE), as ram_block_from_stream tracks it.
func (s *splitter) recordBlock(flags uint64) (int, error) {
	if flags&flagContinue != 0 {
		if s.inLast < 0 {
			return 0, s.in.refuse("continued page record before any named one")
		}
		return s.inLast, nil
	}
	name, err := s.in.name("block name")
	if err != nil {
		return 0, err
	}
	b := s.find(name)
	if b < 0 {
		return 0, s.in.refuse("page of block %q: not in the block list", name)
	}
	s.inLast = b
	return b, nil
}

// extract hands a record of the split block to the caller.
func (s *splitter) extract(flags uint64, off int64) error {
	p := Page{Off: off}
	if flags&flagZero != 0 {
		fill, err := s.in.u8("fill byte")
		if err != nil {
			return err
		}
		p.Fill = fill
		s.stats.FillPages++
	} else {
		data, err := s.in.next(PageSize, "page")
		if err != nil {
			return err
		}
		p.Data = data
	}
	s.stats.Pages++
	if err := s.page(p); err != nil {
		return fmt.Errorf("page %#x: %w", off, err)
	}
	return nil
}

// keep copies a record of another block as it is. A record that
// continues (CONTINUE) never needs its block's name back: it continues the
// input's previous record, which was of the same block and so was kept
// too; a record after a removed one is named, or it would be the removed
// block's.
func (s *splitter) keep(hdr uint64, b int) error {
	if err := s.out.be64(hdr); err != nil {
		return err
	}
	if hdr&flagContinue == 0 {
		if err := s.out.nameString(s.blocks[b].name); err != nil {
			return err
		}
	}
	if hdr&flagZero != 0 {
		return s.copy(1, "fill byte")
	}
	return s.copy(PageSize, "page")
}
