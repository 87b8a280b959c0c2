package devstate

import (
	"bytes"
	"encoding/binary"
)

// testRAMID is the section id ram gets in test streams.
const testRAMID = 2

// blk is a block of a test stream's block list.
type blk struct {
	name   string
	length uint64
}

// sw writes test streams the way QEMU 7.2 does; every method returns the
// writer so that a stream reads as one chain.
type sw struct {
	bytes.Buffer
	noAddr bool // the block list has no guest addresses (x-ignore-shared off)
}

func (w *sw) u8(v byte) *sw { w.WriteByte(v); return w }

func (w *sw) be32(v uint32) *sw {
	w.Write(binary.BigEndian.AppendUint32(nil, v))
	return w
}

func (w *sw) be64(v uint64) *sw {
	w.Write(binary.BigEndian.AppendUint64(nil, v))
	return w
}

// str is an idstr: u8 length and bytes.
func (w *sw) str(s string) *sw { w.u8(byte(len(s))); w.WriteString(s); return w }

func (w *sw) raw(b []byte) *sw { w.Write(b); return w }

// magic is the file header.
func (w *sw) magic() *sw { return w.be32(fileMagic).be32(fileVersion) }

// config is the configuration with capabilities caps.
func (w *sw) config(caps ...string) *sw {
	w.u8(configuration).be32(10).WriteString("pc-q35-7.2")
	if len(caps) > 0 {
		w.u8(subsection).str(subCapabilities).be32(1).be32(uint32(len(caps)))
		for _, c := range caps {
			w.str(c)
		}
	}
	return w
}

// header is the file header and a configuration with x-ignore-shared.
func (w *sw) header() *sw { return w.magic().config(capIgnoreShared) }

// ramStart is ram's START section listing blocks, with guest addresses
// (x-ignore-shared).
func (w *sw) ramStart(blocks ...blk) *sw {
	w.startHeader("ram", ramInstance, ramVersion)
	var total uint64
	for _, b := range blocks {
		total += b.length
	}
	w.be64(total | flagMemSize)
	for i, b := range blocks {
		w.str(b.name).be64(b.length)
		if !w.noAddr {
			w.be64(uint64(i) << 32)
		}
	}
	return w.eos().footer()
}

func (w *sw) startHeader(name string, instance, version uint32) *sw {
	return w.u8(sectionStart).be32(testRAMID).str(name).be32(instance).be32(version)
}

// section opens a PART or END section of ram's.
func (w *sw) section(typ byte) *sw { return w.u8(typ).be32(testRAMID) }

// page is a PAGE record; an empty block continues the previous record's.
func (w *sw) page(block string, off uint64, data []byte) *sw {
	return w.record(block, off|flagPage).raw(data)
}

// fill is a ZERO record of byte b.
func (w *sw) fill(block string, off uint64, b byte) *sw {
	return w.record(block, off|flagZero).u8(b)
}

func (w *sw) record(block string, hdr uint64) *sw {
	if block == "" {
		return w.be64(hdr | flagContinue)
	}
	return w.be64(hdr).str(block)
}

func (w *sw) eos() *sw    { return w.be64(flagEOS) }
func (w *sw) footer() *sw { return w.u8(footer).be32(testRAMID) }

// devices stands for what follows ram's END section: a FULL section, EOF
// and a vmdesc, copied verbatim.
func (w *sw) devices() *sw {
	w.u8(sectionFull).be32(3).str("timer").be32(0).be32(2).raw(make([]byte, 24)).u8(footer).be32(3)
	w.u8(sectionEOF)
	desc := `{"page_size":4096,"devices":[]}`
	return w.u8(vmDescription).be32(uint32(len(desc))).raw([]byte(desc))
}

// pageOf is a page of bytes distinct for every seed.
func pageOf(seed byte) []byte {
	p := make([]byte, PageSize)
	for i := range p {
		p[i] = seed + byte(i*7)
	}
	return p
}
