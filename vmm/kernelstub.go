package vmm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// A restored VM never reads its kernel: the kernel the guest runs is in the
// snapshot's RAM. QEMU still needs -kernel, because -kernel adds the
// linuxboot option ROM whose RAM block the migration stream carries, but
// QEMU 7.2 reads the whole file into its own heap and keeps it for the VM's
// life (fw_cfg serves it to the boot ROM): 13.5 MiB of the Debian cloud
// kernel, and the initrd beside it, in every restored QEMU, shared with
// none. A restore therefore gets a stub: the kernel's own boot header and
// setup sectors, which QEMU parses exactly as for the real file, and one
// page of zeros for the protected-mode part no one runs. No -initrd is
// given: the initrd only reaches guest RAM through that boot ROM.

// Offsets and values of the x86 Linux boot protocol
// (Documentation/arch/x86/boot.rst).
const (
	bootSetupSects = 0x1f1      // setup_sects: 512-byte sectors after the boot sector
	bootHeaderAt   = 0x202      // "HdrS"
	bootHeaderLen  = 0x206 + 2  // through the protocol version
	bootMagic      = 0x53726448 // "HdrS", little-endian
	stubPayload    = 4096
)

// errNoBootHeader: the kernel is not a bzImage (an ELF kernel QEMU boots
// through PVH): its restores get the file itself.
var errNoBootHeader = errors.New("no bzImage boot header (HdrS)")

// kernelStub returns a sealed memfd with the boot header and setup
// sectors of the bzImage at path, followed by a page of zeros.
func kernelStub(path string) (*os.File, error) {
	k, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer k.Close()
	setup, err := readSetup(k)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", path, err)
	}
	fd, err := unix.MemfdCreate("cryo-kernel-stub", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("kernel stub: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:cryo-kernel-stub")
	if err := fillStub(f, setup); err != nil {
		f.Close()
		return nil, fmt.Errorf("kernel stub: %w", err)
	}
	return f, nil
}

// readSetup reads the boot sector and setup sectors of a bzImage,
// refusing a file that is not one (QEMU would boot it some other way, as
// multiboot or ELF, and a stub of it would mean nothing).
func readSetup(k *os.File) ([]byte, error) {
	hdr := make([]byte, bootHeaderLen)
	if _, err := io.ReadFull(k, hdr); err != nil {
		return nil, fmt.Errorf("boot header: %w", err)
	}
	if binary.LittleEndian.Uint32(hdr[bootHeaderAt:]) != bootMagic {
		return nil, fmt.Errorf("%w at %#x", errNoBootHeader, bootHeaderAt)
	}
	sects := int(hdr[bootSetupSects])
	if sects == 0 {
		sects = 4 // the boot protocol's default
	}
	size := (sects + 1) * 512
	setup := make([]byte, size)
	copy(setup, hdr)
	if _, err := io.ReadFull(k, setup[len(hdr):]); err != nil {
		return nil, fmt.Errorf("setup sectors (%d bytes): %w", size, err)
	}
	return setup, nil
}

// fillStub writes setup and the zero page into f, seals it against every
// change and rewinds it.
func fillStub(f *os.File, setup []byte) error {
	if _, err := f.Write(setup); err != nil {
		return err
	}
	if err := f.Truncate(int64(len(setup) + stubPayload)); err != nil {
		return err
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, Seals); err != nil {
		return err
	}
	_, err := f.Seek(0, io.SeekStart)
	return err
}
