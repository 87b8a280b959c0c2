package devstate

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/containerd/errdefs"
)

// PageSize is x86's target page size: the unit of every page record.
const PageSize = 4096

// The stream's markers (migration/savevm.h).
const (
	fileMagic   = 0x5145564d // "QEVM"
	fileVersion = 3

	sectionEOF    = 0x00
	sectionStart  = 0x01
	sectionPart   = 0x02
	sectionEnd    = 0x03
	sectionFull   = 0x04
	subsection    = 0x05
	vmDescription = 0x06
	configuration = 0x07
	command       = 0x08
	footer        = 0x7e
)

// Flags in the low bits of a RAM record's first be64 (migration/ram.c,
// RAM_SAVE_FLAG_*; HOOK is RDMA's, migration/qemu-file.h).
const (
	flagZero     = 0x02
	flagMemSize  = 0x04
	flagPage     = 0x08
	flagEOS      = 0x10
	flagContinue = 0x20
	flagXBZRLE   = 0x40
	flagHook     = 0x80
	flagCompress = 0x100

	flagMask = PageSize - 1 // the loader splits offset and flags at the target page
)

// Caps on what the stream may claim: every length read from it is checked
// against one of these before anything is read or allocated by it.
const (
	maxName     = 255 // an idstr is char[256], sent with a u8 length
	maxBlocks   = 1024
	maxCaps     = 64        // QEMU 7.2 has 21 migration capabilities
	readBufSize = 128 << 10 // twice a pipe's default capacity
)

// reader consumes the stream through a bufio.Reader and counts its
// position, which every refusal names.
type reader struct {
	r   *bufio.Reader
	pos int64
}

// next consumes n (≤ readBufSize) bytes and returns them; the slice is
// valid until the next read.
func (r *reader) next(n int, what string) ([]byte, error) {
	b, err := r.r.Peek(n)
	if len(b) < n {
		if err == nil || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s at byte %d: stream truncated: %w: %w", what, r.pos, errdefs.ErrInvalidArgument, io.ErrUnexpectedEOF)
		}
		return nil, fmt.Errorf("read %s at byte %d: %w", what, r.pos, err)
	}
	r.r.Discard(n)
	r.pos += int64(n)
	return b, nil
}

func (r *reader) u8(what string) (byte, error) {
	b, err := r.next(1, what)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (r *reader) be32(what string) (uint32, error) {
	b, err := r.next(4, what)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b), nil
}

func (r *reader) be64(what string) (uint64, error) {
	b, err := r.next(8, what)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b), nil
}

// name reads a u8 length and that many bytes (an idstr); an empty one
// names nothing QEMU knows.
func (r *reader) name(what string) ([]byte, error) {
	n, err := r.u8(what + " length")
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, r.refuse("%s: empty", what)
	}
	return r.next(int(n), what)
}

// peek returns the next byte without consuming it; ok is false at the
// end of the stream.
func (r *reader) peek() (b byte, ok bool, err error) {
	p, err := r.r.Peek(1)
	if len(p) == 1 {
		return p[0], true, nil
	}
	if errors.Is(err, io.EOF) {
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("read at byte %d: %w", r.pos, err)
}

// refuse is an error for input that is not a stream Split can handle
// exactly; it says where.
func (r *reader) refuse(format string, args ...any) error {
	return fmt.Errorf("%s (at byte %d): %w", fmt.Sprintf(format, args...), r.pos, errdefs.ErrInvalidArgument)
}

// writer is the output and its count.
type writer struct {
	w       *bufio.Writer
	n       int64
	scratch [8]byte
}

func (w *writer) Write(b []byte) (int, error) {
	n, err := w.w.Write(b)
	w.n += int64(n)
	if err != nil {
		return n, fmt.Errorf("write device state: %w", err)
	}
	return n, nil
}

func (w *writer) u8(v byte) error {
	w.scratch[0] = v
	_, err := w.Write(w.scratch[:1])
	return err
}

func (w *writer) be32(v uint32) error {
	binary.BigEndian.PutUint32(w.scratch[:4], v)
	_, err := w.Write(w.scratch[:4])
	return err
}

func (w *writer) be64(v uint64) error {
	binary.BigEndian.PutUint64(w.scratch[:8], v)
	_, err := w.Write(w.scratch[:8])
	return err
}

// name writes an idstr with its u8 length.
func (w *writer) name(s []byte) error {
	if err := w.u8(byte(len(s))); err != nil {
		return err
	}
	_, err := w.Write(s)
	return err
}

// nameString writes an idstr (≤ maxName bytes) with its u8 length.
func (w *writer) nameString(s string) error {
	if err := w.u8(byte(len(s))); err != nil {
		return err
	}
	n, err := w.w.WriteString(s)
	w.n += int64(n)
	if err != nil {
		return fmt.Errorf("write device state: %w", err)
	}
	return nil
}
