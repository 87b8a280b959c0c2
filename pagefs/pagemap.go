package pagefs

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mapping is one line of /proc/<pid>/maps.
type Mapping struct {
	Start, End uintptr
	Path       string
}

// FindMapping returns pid's mapping of path of exactly size bytes (QEMU's
// guest RAM: one mapping of the whole memory-backend-file).
func FindMapping(pid int, path string, size int64) (Mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return Mapping{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || strings.Join(fields[5:], " ") != path {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		s, err1 := strconv.ParseUint(lo, 16, 64)
		e, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && int64(e-s) == size {
			return Mapping{Start: uintptr(s), End: uintptr(e), Path: path}, nil
		}
	}
	if err := sc.Err(); err != nil {
		return Mapping{}, err
	}
	return Mapping{}, fmt.Errorf("pid %d has no %d-byte mapping of %s", pid, size, path)
}

// Pagemap bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
	pmFile    = 1 << 61 // file page or shared anon
)

// PrivatePagesPagemap returns the pages of m (as page indexes from
// m.Start) that pid holds privately: present or swapped and not a file
// page. In a MAP_PRIVATE file mapping these are exactly the pages written
// since the mapping was made (copied on write). It reads
// /proc/<pid>/pagemap, 8 bytes per page.
func PrivatePagesPagemap(pid int, m Mapping) ([]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	pages := int64(m.End-m.Start) / PageSize
	buf := make([]byte, 8*min(pages, 1<<16))
	var out []int64
	for done := int64(0); done < pages; {
		n := min(pages-done, int64(len(buf)/8))
		if _, err := f.ReadAt(buf[:8*n], int64(m.Start/PageSize+uintptr(done))*8); err != nil {
			return nil, fmt.Errorf("pagemap of %d: %w", pid, err)
		}
		for i := int64(0); i < n; i++ {
			e := binary.LittleEndian.Uint64(buf[8*i:])
			if e&(pmPresent|pmSwapped) != 0 && e&pmFile == 0 {
				out = append(out, done+i)
			}
		}
		done += n
	}
	return out, nil
}

// PAGEMAP_SCAN (Linux 6.7).
const (
	pageIsFile    = 1 << 2
	pageIsPresent = 1 << 3
	pageIsSwapped = 1 << 4
	pagemapScan   = 0xc0606610 // _IOWR('f', 16, struct pm_scan_arg)
)

type pmScanArg struct {
	Size, Flags, Start, End, WalkEnd, Vec, VecLen, MaxPages       uint64
	CategoryInverted, CategoryMask, CategoryAnyofMask, ReturnMask uint64
}

type pageRegion struct{ Start, End, Categories uint64 }

// PrivatePagesScan is PrivatePagesPagemap with the PAGEMAP_SCAN ioctl:
// the kernel returns runs of matching pages instead of one entry per page.
func PrivatePagesScan(pid int, m Mapping) ([]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	vec := make([]pageRegion, 4096)
	var out []int64
	for start := uint64(m.Start); start < uint64(m.End); {
		arg := pmScanArg{
			Size: uint64(unsafe.Sizeof(pmScanArg{})), Start: start, End: uint64(m.End),
			Vec: uint64(uintptr(unsafe.Pointer(&vec[0]))), VecLen: uint64(len(vec)),
			CategoryInverted: pageIsFile, CategoryMask: pageIsFile,
			CategoryAnyofMask: pageIsPresent | pageIsSwapped, ReturnMask: pageIsPresent | pageIsSwapped | pageIsFile,
		}
		n, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), pagemapScan, uintptr(unsafe.Pointer(&arg)))
		if errno != 0 {
			return nil, fmt.Errorf("PAGEMAP_SCAN of %d: %w", pid, errno)
		}
		for _, r := range vec[:n] {
			for a := r.Start; a < r.End; a += PageSize {
				out = append(out, int64(uintptr(a)-m.Start)/PageSize)
			}
		}
		if arg.WalkEnd <= start {
			return nil, fmt.Errorf("PAGEMAP_SCAN of %d made no progress at %#x", pid, start)
		}
		start = arg.WalkEnd
	}
	return out, nil
}

// ReadPages copies pages (indexes from m.Start) of pid's memory into dst
// (len(pages)*PageSize bytes) with process_vm_readv, in runs of
// consecutive pages.
func ReadPages(pid int, m Mapping, pages []int64, dst []byte) error {
	if len(dst) < len(pages)*PageSize {
		return fmt.Errorf("read pages: buffer of %d bytes for %d pages", len(dst), len(pages))
	}
	const maxIov = 1024 // IOV_MAX
	var local []unix.Iovec
	var remote []unix.RemoteIovec
	flush := func() error {
		for len(remote) > 0 {
			want := 0
			for _, r := range remote {
				want += r.Len
			}
			n, err := unix.ProcessVMReadv(pid, local, remote, 0)
			if err != nil {
				return fmt.Errorf("process_vm_readv %d: %w", pid, err)
			}
			if n != want {
				return fmt.Errorf("process_vm_readv %d: %d of %d bytes", pid, n, want)
			}
			local, remote = local[:0], remote[:0]
		}
		return nil
	}
	for i := 0; i < len(pages); {
		j := i + 1
		for j < len(pages) && pages[j] == pages[j-1]+1 {
			j++
		}
		b := dst[i*PageSize : j*PageSize]
		iov := unix.Iovec{Base: &b[0]}
		iov.SetLen(len(b))
		local = append(local, iov)
		remote = append(remote, unix.RemoteIovec{Base: m.Start + uintptr(pages[i])*PageSize, Len: len(b)})
		if len(remote) == maxIov {
			if err := flush(); err != nil {
				return err
			}
		}
		i = j
	}
	return flush()
}
