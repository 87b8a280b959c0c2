// Package sparse copies files that are mostly holes (a guest's RAM file)
// fast: data extents only, in the kernel (copy_file_range), on every core.
package sparse

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// copyPiece is the largest range one copy call moves: small enough to
// spread a few large extents over every worker.
const copyPiece = 4 << 20

// Copy copies src to a new file dst (0600: it holds guest memory, owned by
// uid:uid when uid >= 0), skipping holes (an idle guest's RAM file is
// mostly holes). It runs inside a checkpoint's pause window, while the
// guest's vCPUs are stopped, and before a restored QEMU starts, so it uses
// every core: the data extents are cut into pieces that copy_file_range(2)
// moves in the kernel on GOMAXPROCS goroutines, without a round trip
// through user memory. Where the kernel cannot (EXDEV, a file system
// without support), pieces are copied with pread/pwrite. dst must not
// exist; on failure it is removed.
func Copy(dst, src string, uid int) (retErr error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("copy %s: not a regular file", src)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err := out.Close(); err != nil && retErr == nil {
			retErr = err
		}
		if retErr != nil {
			os.Remove(dst)
		}
	}()
	if uid >= 0 {
		if err := out.Chown(uid, uid); err != nil {
			return err
		}
	}
	if err := out.Truncate(st.Size()); err != nil {
		return err
	}
	return CopyData(out, in, st.Size())
}

// CopyData copies the data extents of the first size bytes of in to the
// same offsets of out, which the caller has sized (a shared RAM base's
// memfd: nodecache.Bases.Share's fill): holes are skipped, so they stay
// zero and take no memory or disk in out. It moves the data like Copy,
// on every core.
func CopyData(out, in *os.File, size int64) error {
	pieces, err := dataPieces(in, size, copyPiece)
	if err != nil {
		return fmt.Errorf("find data in %s: %w", in.Name(), err)
	}
	var g errgroup.Group
	work := make(chan [2]int64)
	g.Go(func() error {
		defer close(work)
		for _, p := range pieces {
			work <- p
		}
		return nil
	})
	for range min(runtime.GOMAXPROCS(0), len(pieces)) {
		g.Go(func() error {
			var buf []byte
			for p := range work {
				if err := copyRange(in, out, p[0], p[1], &buf); err != nil {
					for range work {
					}
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// dataPieces returns the data ranges {offset, length} of f (SEEK_DATA /
// SEEK_HOLE), cut into pieces of at most piece bytes.
func dataPieces(f *os.File, size, piece int64) ([][2]int64, error) {
	var out [][2]int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return nil, err
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		for o := data; o < hole; o += piece {
			out = append(out, [2]int64{o, min(piece, hole-o)})
		}
		off = hole
	}
	return out, nil
}

// copyRange copies n bytes at off from in to the same offset of out.
func copyRange(in, out *os.File, off, n int64, buf *[]byte) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(n), 0)
		if err != nil || c == 0 {
			if err != nil && !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.ENOSYS) &&
				!errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EINVAL) {
				return err
			}
			return preadPwrite(in, out, off, n, buf)
		}
		off, n = off+int64(c), n-int64(c)
	}
	return nil
}

// preadPwrite is copyRange's fallback through a 1 MiB buffer.
func preadPwrite(in, out *os.File, off, n int64, buf *[]byte) error {
	if *buf == nil {
		*buf = make([]byte, 1<<20)
	}
	for n > 0 {
		b := (*buf)[:min(n, int64(len(*buf)))]
		r, err := in.ReadAt(b, off)
		if r < len(b) {
			if err == nil {
				err = fmt.Errorf("short read at %d", off)
			}
			return err
		}
		if _, err := out.WriteAt(b, off); err != nil {
			return err
		}
		off, n = off+int64(r), n-int64(r)
	}
	return nil
}
