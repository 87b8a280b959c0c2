// Package qcow2 writes empty qcow2 overlays: what `qemu-img create -f qcow2
// -F raw -b <base>` makes, without starting a process for it (a restore and
// every container's rootfs need one, and qemu-img costs 20-40 ms a run
// here, most of it loading shared libraries).
//
// The image is qcow2 version 3 with 64 KiB clusters and 16-bit refcounts,
// laid out as qemu-img lays it out: the header with its extensions and the
// backing file name in cluster 0, the refcount table in cluster 1, its one
// refcount block in cluster 2, the L1 table in cluster 3; no data cluster is
// allocated, so every read falls through to the backing file.
package qcow2

import (
	"encoding/binary"
	"fmt"
	"os"
)

const (
	clusterBits = 16
	clusterSize = 1 << clusterBits
	// l2Coverage is what one L1 entry maps: an L2 table of 8-byte entries,
	// each one cluster.
	l2Coverage = clusterSize * (clusterSize / 8)
	// maxL1 is the largest L1 table this writer lays out, one cluster:
	// images up to 4 TiB.
	maxL1 = clusterSize / 8

	headerLength        = 112 // version 3 with the compression type byte
	extBackingFormat    = 0xe2792aca
	refcountOrder       = 4 // 16-bit refcounts
	refcountTableOffset = 1 * clusterSize
	refcountBlockOffset = 2 * clusterSize
	l1TableOffset       = 3 * clusterSize
)

// CreateOverlay makes path (it must not exist; mode 0600: it will hold
// guest data) an empty qcow2 image of size bytes over the raw image
// backing, named in the image as given.
func CreateOverlay(path, backing string, size int64) error {
	return CreateOverlayOf(path, backing, "raw", size)
}

// CreateOverlayOf is CreateOverlay over a backing image of the given format
// ("raw" or "qcow2").
func CreateOverlayOf(path, backing, format string, size int64) (retErr error) {
	if format != "raw" && format != "qcow2" {
		return fmt.Errorf("qcow2 overlay %s: backing format %q: want raw or qcow2", path, format)
	}
	if size <= 0 || size%512 != 0 {
		return fmt.Errorf("qcow2 overlay %s: size %d is not a positive multiple of 512", path, size)
	}
	l1 := (size + l2Coverage - 1) / l2Coverage
	if l1 > maxL1 {
		return fmt.Errorf("qcow2 overlay %s: %d bytes is larger than this writer supports (4 TiB)", path, size)
	}
	ext := 8 + (len(format)+7)/8*8 + 8 // backing format extension, then the end marker
	nameOff := headerLength + ext
	if backing == "" || nameOff+len(backing) > clusterSize || len(backing) > 1023 {
		return fmt.Errorf("qcow2 overlay %s: backing file name %q: empty or too long", path, backing)
	}

	img := make([]byte, l1TableOffset+int(l1)*8)
	be := binary.BigEndian
	h := img[:headerLength]
	copy(h[0:], "QFI\xfb")
	be.PutUint32(h[4:], 3)                     // version
	be.PutUint64(h[8:], uint64(nameOff))       // backing_file_offset
	be.PutUint32(h[16:], uint32(len(backing))) // backing_file_size
	be.PutUint32(h[20:], clusterBits)          // cluster_bits
	be.PutUint64(h[24:], uint64(size))         // size
	be.PutUint32(h[32:], 0)                    // crypt_method
	be.PutUint32(h[36:], uint32(l1))           // l1_size
	be.PutUint64(h[40:], l1TableOffset)        // l1_table_offset
	be.PutUint64(h[48:], refcountTableOffset)  // refcount_table_offset
	be.PutUint32(h[56:], 1)                    // refcount_table_clusters
	be.PutUint32(h[60:], 0)                    // nb_snapshots
	be.PutUint64(h[64:], 0)                    // snapshots_offset
	be.PutUint32(h[96:], refcountOrder)        // refcount_order
	be.PutUint32(h[100:], headerLength)        // header_length
	// h[104] compression_type 0 (zlib), then padding to 112.

	e := img[headerLength:]
	be.PutUint32(e[0:], extBackingFormat)
	be.PutUint32(e[4:], uint32(len(format)))
	copy(e[8:], format)
	// The end-of-extensions marker (type 0, length 0) is already zero.
	copy(img[nameOff:], backing)

	be.PutUint64(img[refcountTableOffset:], refcountBlockOffset)
	for c := range 4 { // header, refcount table, refcount block, L1 table
		be.PutUint16(img[refcountBlockOffset+2*c:], 1)
	}
	// The L1 table's entries are zero: no L2 table, every cluster unallocated.

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("qcow2 overlay: %w", err)
	}
	defer func() {
		if err := f.Close(); err != nil && retErr == nil {
			retErr = fmt.Errorf("qcow2 overlay: %w", err)
		}
		if retErr != nil {
			os.Remove(path)
		}
	}()
	if _, err := f.Write(img); err != nil {
		return fmt.Errorf("qcow2 overlay: %w", err)
	}
	return nil
}
