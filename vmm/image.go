package vmm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// maxChain bounds a disk's backing chain (overlays of overlays, one more
// per checkpoint of a running VM).
const maxChain = 16

// image is one file of a disk's backing chain, top first.
type image struct {
	path, format string
	backing      *image
}

// imageChain reads the backing chain of a disk image from its qcow2
// headers, so that QEMU is given every file of the chain as a descriptor
// instead of opening the backing files by the names in the headers. A raw
// image has no backing file; its bytes are never parsed (they are the
// guest's).
func imageChain(path, format string) (*image, error) {
	top := &image{path: path, format: format}
	im := top
	for depth := 0; im.format == "qcow2"; depth++ {
		if depth == maxChain {
			return nil, fmt.Errorf("disk image %s: backing chain longer than %d", path, maxChain)
		}
		name, bfmt, err := qcow2Backing(im.path)
		if err != nil {
			return nil, err
		}
		if name == "" {
			break
		}
		if !filepath.IsAbs(name) {
			name = filepath.Join(filepath.Dir(im.path), name)
		}
		st, err := os.Stat(name)
		if err != nil {
			return nil, fmt.Errorf("disk image %s: backing file: %w", im.path, err)
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("disk image %s: backing file %s is not a regular file", im.path, name)
		}
		im.backing = &image{path: name, format: bfmt}
		im = im.backing
	}
	return top, nil
}

// qcow2Backing returns the backing file name and format that a qcow2
// header names ("" when it has none). A file that is not qcow2 has none:
// QEMU itself reports it.
func qcow2Backing(path string) (name, format string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	const cluster0 = 64 << 10 // names and extensions that cryo and qemu-img write live here
	b := make([]byte, cluster0)
	n, err := io.ReadFull(f, b)
	if err != nil && err != io.ErrUnexpectedEOF {
		return "", "", fmt.Errorf("disk image %s: %w", path, err)
	}
	b = b[:n]
	be := binary.BigEndian
	if len(b) < 72 || !bytes.Equal(b[:4], []byte("QFI\xfb")) {
		return "", "", nil
	}
	off, size := be.Uint64(b[8:]), uint64(be.Uint32(b[16:]))
	if off == 0 || size == 0 {
		return "", "", nil
	}
	if size > 1023 || off+size > uint64(len(b)) {
		return "", "", fmt.Errorf("disk image %s: backing file name at %d+%d is out of bounds", path, off, size)
	}
	name = string(b[off : off+size])
	format = "raw" // without the extension QEMU would probe; cryo never writes such images
	hdrLen := uint64(72)
	if be.Uint32(b[4:]) >= 3 && len(b) >= 104 {
		hdrLen = uint64(be.Uint32(b[100:]))
	}
	for p := hdrLen; p+8 <= uint64(len(b)); {
		typ, l := be.Uint32(b[p:]), uint64(be.Uint32(b[p+4:]))
		if typ == 0 || p+8+l > uint64(len(b)) {
			break
		}
		if typ == 0xe2792aca { // backing file format name
			format = string(b[p+8 : p+8+l])
		}
		p += 8 + (l+7)/8*8
	}
	if format != "raw" && format != "qcow2" {
		return "", "", fmt.Errorf("disk image %s: backing format %q: want raw or qcow2", path, format)
	}
	return name, format, nil
}

// virtualSize is the guest-visible size of an image: the qcow2 header's, or
// a raw file's length rounded up to whole sectors, as QEMU sees it.
func virtualSize(path, format string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if format == "qcow2" {
		var h [32]byte
		if _, err := io.ReadFull(f, h[:]); err == nil && bytes.Equal(h[:4], []byte("QFI\xfb")) {
			return int64(binary.BigEndian.Uint64(h[24:])), nil
		}
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return (st.Size() + 511) / 512 * 512, nil
}

// passedFile is a file the machine opens and hands to QEMU in fd set set.
type passedFile struct {
	path string
	flag int // os.O_RDONLY or os.O_RDWR
	set  int
}

// chainFiles lists the descriptors for a chain, one fd set per image: a
// writable top image gets a read-write descriptor, every other a read-only
// one. (Only one per set: QEMU's fd set keeps every descriptor's open file,
// and with it the image locks QEMU took through it, alive; a second
// descriptor that QEMU used once makes the next activation of the image
// fail with "Failed to get shared "write" lock".)
func chainFiles(top *image, readOnly bool, nextSet func() int) (sets []int, files []passedFile) {
	for im, first := top, true; im != nil; im, first = im.backing, false {
		s := nextSet()
		sets = append(sets, s)
		if first && !readOnly {
			files = append(files, passedFile{path: im.path, flag: os.O_RDWR, set: s})
			continue
		}
		files = append(files, passedFile{path: im.path, flag: os.O_RDONLY, set: s})
	}
	return sets, files
}

// chainNode is the blockdev-add argument for a chain whose images are in
// fd sets sets (top first): every backing file is given explicitly, so QEMU
// never opens a file by a name found in an image header.
func chainNode(top *image, sets []int, node string, readOnly bool) map[string]any {
	var build func(im *image, i int) map[string]any
	build = func(im *image, i int) map[string]any {
		ro := readOnly || i > 0
		n := map[string]any{
			"driver":    im.format,
			"read-only": ro,
			"file":      fileNode(fdsetPath(sets[i]), ro),
		}
		if i == 0 {
			n["node-name"] = node
		}
		if im.format == "qcow2" {
			if im.backing != nil {
				n["backing"] = build(im.backing, i+1)
			} else {
				n["backing"] = nil
			}
		}
		return n
	}
	return build(top, 0)
}

func fdsetPath(set int) string { return fmt.Sprintf("/dev/fdset/%d", set) }

// fileNode is the protocol node of an image file. drop-cache off: QEMU
// drops a file's host page cache (posix_fadvise DONTNEED) when the VM
// continues after a migration, in case the destination wrote the image;
// cryo's migrations are checkpoints of a VM that runs on here, and
// nothing else writes its images, so the cache stays valid. Dropping it
// cost the pause (from a restored VM's second checkpoint on, its cont
// took 40-50 ms of a 60-90 ms pause, in the fadvise of one image) and
// the guest's next reads of its disk, which went to the disk or the
// snapshot's server again.
func fileNode(path string, readOnly bool) map[string]any {
	return map[string]any{"driver": "file", "filename": path, "read-only": readOnly, "drop-cache": false}
}
