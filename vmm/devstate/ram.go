package devstate

// ram's section as migration/ram.c registers it.
const (
	ramIDStr    = "ram"
	ramInstance = 0
	ramVersion  = 4
)

// ramSections reads ram's START, PART and END sections, which come before
// any device's section. Another iterable section (block migration, dirty
// bitmaps) or a command (postcopy, return path, COLO) among them is
// refused: its syntax is not generic.
func (s *splitter) ramSections() error {
	for !s.ramEnded {
		typ, err := s.in.u8("section type")
		if err != nil {
			return err
		}
		switch typ {
		case sectionStart:
			err = s.ramStart()
		case sectionPart, sectionEnd:
			err = s.ramPart(typ)
		case command:
			err = s.in.refuse("command section before ram's end (postcopy, return path or COLO)")
		default:
			err = s.in.refuse("section type %#02x before ram's end section", typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ramStart is ram's START section: the block list.
func (s *splitter) ramStart() error {
	id, err := s.in.be32("section id")
	if err != nil {
		return err
	}
	if s.ramStarted {
		return s.in.refuse("second start section (id %d) before ram's end", id)
	}
	if err := s.out.u8(sectionStart); err != nil {
		return err
	}
	if err := s.out.be32(id); err != nil {
		return err
	}
	name, err := s.copyName("section name")
	if err != nil {
		return err
	}
	if string(name) != ramIDStr {
		return s.in.refuse("start section %q before ram's end: only ram's can be split", name)
	}
	instance, err := s.in.be32("instance id")
	if err != nil {
		return err
	}
	version, err := s.in.be32("version id")
	if err != nil {
		return err
	}
	if instance != ramInstance || version != ramVersion {
		return s.in.refuse("ram instance %d version %d: want %d version %d", instance, version, ramInstance, ramVersion)
	}
	if err := s.out.be32(instance); err != nil {
		return err
	}
	if err := s.out.be32(version); err != nil {
		return err
	}
	s.ramID, s.ramStarted = id, true
	for _, step := range []func() error{s.blockList, s.endOfSection, s.footer} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// blockList is the RAM blocks and their lengths; their sum comes first.
func (s *splitter) blockList() error {
	hdr, err := s.in.be64("ram size record")
	if err != nil {
		return err
	}
	if hdr&flagMask != flagMemSize {
		return s.in.refuse("ram start record flags %#x: want the block list (%#x)", hdr&flagMask, flagMemSize)
	}
	if err := s.out.be64(hdr); err != nil {
		return err
	}
	for total := hdr &^ flagMask; total > 0; {
		if len(s.blocks) == maxBlocks {
			return s.in.refuse("block list: over %d blocks", maxBlocks)
		}
		b, err := s.listedBlock(total)
		if err != nil {
			return err
		}
		s.blocks = append(s.blocks, b)
		total -= uint64(b.length)
	}
	for i, b := range s.blocks {
		if b.name == s.block {
			s.target, s.stats.BlockSize = i, b.length
		}
	}
	if s.target < 0 {
		return s.in.refuse("block %q: not in the stream's block list", s.block)
	}
	return nil
}

// listedBlock is one entry of the block list, of at most total bytes.
func (s *splitter) listedBlock(total uint64) (ramBlock, error) {
	name, err := s.copyName("block name")
	if err != nil {
		return ramBlock{}, err
	}
	if s.find(name) >= 0 {
		return ramBlock{}, s.in.refuse("block %q: listed twice", name)
	}
	b := ramBlock{name: string(name)}
	length, err := s.in.be64("block length")
	if err != nil {
		return ramBlock{}, err
	}
	if length == 0 || length%PageSize != 0 || length > total {
		return ramBlock{}, s.in.refuse("block %q length %d: want a multiple of %d, at most the %d bytes left of the total", b.name, length, PageSize, total)
	}
	b.length = int64(length)
	if err := s.out.be64(length); err != nil {
		return ramBlock{}, err
	}
	if s.ignoreShared {
		// The block's guest address, which the loader checks.
		if err := s.copy(8, "block address"); err != nil {
			return ramBlock{}, err
		}
	}
	return b, nil
}

// find returns the index of the block named name, -1 if none.
func (s *splitter) find(name []byte) int {
	for i := range s.blocks {
		if s.blocks[i].name == string(name) {
			return i
		}
	}
	return -1
}

// ramPart is ram's PART or END section: page records.
func (s *splitter) ramPart(typ byte) error {
	id, err := s.in.be32("section id")
	if err != nil {
		return err
	}
	if !s.ramStarted || id != s.ramID {
		return s.in.refuse("section %d (type %#02x) before ram's end: not ram's", id, typ)
	}
	if err := s.out.u8(typ); err != nil {
		return err
	}
	if err := s.out.be32(id); err != nil {
		return err
	}
	if err := s.records(); err != nil {
		return err
	}
	s.ramEnded = typ == sectionEnd
	return s.footer()
}

// endOfSection is the EOS record that ends ram's data in every section.
func (s *splitter) endOfSection() error {
	hdr, err := s.in.be64("ram record")
	if err != nil {
		return err
	}
	if hdr != flagEOS {
		return s.in.refuse("ram record %#x after the block list: want the end of section (%#x)", hdr, flagEOS)
	}
	return s.out.be64(hdr)
}

// footer ends every section of ram's.
func (s *splitter) footer() error {
	b, err := s.in.u8("section footer")
	if err != nil {
		return err
	}
	if b != footer {
		return s.in.refuse("section footer marker %#02x: want %#02x", b, footer)
	}
	id, err := s.in.be32("section footer id")
	if err != nil {
		return err
	}
	if id != s.ramID {
		return s.in.refuse("section footer id %d: want ram's %d", id, s.ramID)
	}
	if err := s.out.u8(b); err != nil {
		return err
	}
	return s.out.be32(id)
}
