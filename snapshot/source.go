package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	"golang.org/x/sys/unix"
)

// Source is what Write snapshots: the metadata (Write fills in the format
// fields, files and totals) and the files.
type Source struct {
	Metadata Metadata
	Files    []SourceFile

	closers []io.Closer
}

// SourceFile is one file of a Source.
type SourceFile struct {
	// Name is "ram", "disk:<name>" (see DiskFile), "devstate" or "spec".
	Name string
	// Size is the logical size of the file.
	Size int64
	// ReaderAt reads the file; Write reads disjoint chunks concurrently.
	ReaderAt io.ReaderAt

	// file, when set, is asked for its data extents (SEEK_DATA/SEEK_HOLE)
	// so that holes are skipped without being read.
	file *os.File
	// parent, when set, is the stored file this one was restored from and
	// dirty the pages written since (IncrementalSourceFile).
	parent *Parent
	dirty  []int64
}

// SourcePaths names the files of a sandbox checkpoint on the local disk.
type SourcePaths struct {
	// RAM is the guest RAM file (memory-backend-file on tmpfs), or "".
	RAM string
	// Disks maps a disk name (e.g. "rootfs-<ctr>") to its frozen image.
	Disks map[string]string
	// DevState is the QEMU device-state stream (migration to an fd), or "".
	DevState string
	// Spec is the containers' specs and the sandbox configuration, stored
	// as the "spec" file (encrypted along with the chunks).
	Spec []byte
}

// NewSource opens the files p names and returns a Source for Write. md is
// the caller's metadata (source, fingerprint, containers, network, expiry).
// Close the Source when done.
func NewSource(md Metadata, p SourcePaths) (_ *Source, retErr error) {
	s := &Source{Metadata: md}
	defer func() {
		if retErr != nil {
			s.Close()
		}
	}()
	add := func(name, path string) error {
		f, err := OpenSourceFile(name, path)
		if err != nil {
			return err
		}
		s.closers = append(s.closers, f.file)
		s.Files = append(s.Files, f)
		return nil
	}
	if p.RAM != "" {
		if err := add(FileRAM, p.RAM); err != nil {
			return nil, err
		}
	}
	names := make([]string, 0, len(p.Disks))
	for n := range p.Disks {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := add(DiskFile(n), p.Disks[n]); err != nil {
			return nil, err
		}
	}
	if p.DevState != "" {
		if err := add(FileDevState, p.DevState); err != nil {
			return nil, err
		}
	}
	if p.Spec != nil {
		s.Files = append(s.Files, BytesSourceFile(FileSpec, p.Spec))
	}
	return s, nil
}

// Close closes the files NewSource opened.
func (s *Source) Close() error {
	var errs []error
	for _, c := range s.closers {
		errs = append(errs, c.Close())
	}
	s.closers = nil
	return errors.Join(errs...)
}

// OpenSourceFile opens path as the snapshot file name. The caller closes the
// returned file's ReaderAt (an *os.File).
func OpenSourceFile(name, path string) (SourceFile, error) {
	if err := validFileName(name); err != nil {
		return SourceFile{}, err
	}
	f, err := os.Open(path)
	if err != nil {
		return SourceFile{}, fmt.Errorf("open %s: %w", name, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return SourceFile{}, fmt.Errorf("stat %s: %w", name, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return SourceFile{}, fmt.Errorf("%s: %s is not a regular file", name, path)
	}
	return SourceFile{Name: name, Size: st.Size(), ReaderAt: f, file: f}, nil
}

// BytesSourceFile returns an in-memory file.
func BytesSourceFile(name string, b []byte) SourceFile {
	return SourceFile{Name: name, Size: int64(len(b)), ReaderAt: bytes.NewReader(b)}
}

// chunkIndexes calls fn with the index of every chunk of f that may hold
// data, in increasing order. Without extent information every chunk may.
func (f SourceFile) chunkIndexes(chunkSize int64, fn func(idx int64) error) error {
	n := (f.Size + chunkSize - 1) / chunkSize
	if f.file == nil {
		for i := int64(0); i < n; i++ {
			if err := fn(i); err != nil {
				return err
			}
		}
		return nil
	}
	fd := int(f.file.Fd())
	next := int64(0) // first chunk index not yet emitted
	for off := int64(0); off < f.Size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			// No SEEK_DATA on this file system: everything is data.
			start, err = off, nil
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			end = f.Size
		}
		end = min(end, f.Size)
		if end <= start {
			break
		}
		for i := max(start/chunkSize, next); i < (end+chunkSize-1)/chunkSize; i++ {
			if err := fn(i); err != nil {
				return err
			}
			next = i + 1
		}
		off = end
	}
	return nil
}
