// Package sharedram is a shared clone's guest RAM: a private mapping
// (vmm.MemoryPrivate, Sealed) of the node's base of its snapshot, a sealed
// memfd that every clone of that snapshot on the node maps
// (nodecache.Bases), so that they hold one copy of the pages none of them
// wrote. Each clone's own pages are its QEMU's copy-on-write pages, which
// no other clone sees.
//
// A private mapping is in QEMU's device state whole (x-ignore-shared keeps
// out only shared mappings), so a checkpoint takes the RAM from the stream
// as QEMU writes it (Split): the pages that differ from the base are kept
// for the write, the others dropped, and the stream goes on to the
// snapshot without the RAM, as a lazy restore's does. What the clone wrote
// since its last checkpoint (the write's dirty set) is what differs from
// that checkpoint: the base, and the pages the checkpoint held that differ
// from it, known by their sums.
package sharedram

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"sync"

	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/sandbox/servedram"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/vmm/devstate"
)

// PageSize is the guest's page, the unit of QEMU's RAM stream.
const PageSize = devstate.PageSize

// Base is the node's base of a snapshot's RAM (a *nodecache.Base): a
// sealed memfd of the RAM's size.
type Base interface {
	File() *os.File
	// Path is what QEMU maps (through vmm, which checks the seals).
	Path() string
	Close() error
}

// RAM is a shared clone's guest RAM.
type RAM struct {
	base Base
	size int64
	// view maps the base read-only, for comparing and reading its pages;
	// data says which of its pages are not holes (a hole reads as zeros,
	// and reading one through view would allocate it).
	view []byte
	data []uint64
	// dir holds a checkpoint's pages (an unnamed file, tmpfs).
	dir  string
	seed [2]maphash.Seed

	mu     sync.Mutex
	parent servedram.Parent
	// own are the pages of the parent that differ from the base, by
	// their sums: empty for the snapshot the clone was restored from,
	// which is the base.
	own    map[int64]pageSum
	closed bool
}

type pageSum [2]uint64

// New is the RAM of a clone of parent mapped from base, which holds
// parent's RAM (size bytes). dir (tmpfs, the node's memory dir) holds
// what a checkpoint takes of it until it is written. Close ends it; base
// is the caller's.
func New(base Base, size int64, parent servedram.Parent, dir string) (*RAM, error) {
	if size <= 0 || size%PageSize != 0 {
		return nil, fmt.Errorf("shared ram of %d bytes: want a positive multiple of %d", size, PageSize)
	}
	f := base.File()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shared ram: base: %w", err)
	}
	if st.Size() != size {
		return nil, fmt.Errorf("shared ram: base of %d bytes, the snapshot's ram has %d", st.Size(), size)
	}
	data, err := dataPages(f, size)
	if err != nil {
		return nil, fmt.Errorf("shared ram: base extents: %w", err)
	}
	view, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shared ram: map base: %w", err)
	}
	return &RAM{base: base, size: size, view: view, data: data, dir: dir, parent: parent,
		own: map[int64]pageSum{}, seed: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}, nil
}

// dataPages is the bitmap of f's pages that hold data (SEEK_DATA).
func dataPages(f *os.File, size int64) ([]uint64, error) {
	bits := make([]uint64, (size/PageSize+63)/64)
	for off := int64(0); off < size; {
		start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return nil, err
		}
		end, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		end = min(end, size)
		for p := start / PageSize; p < (end+PageSize-1)/PageSize; p++ {
			bits[p/64] |= 1 << (p % 64)
		}
		off = end
	}
	return bits, nil
}

// Path is the base, as QEMU maps it.
func (r *RAM) Path() string { return r.base.Path() }

// Size is the RAM's size in bytes.
func (r *RAM) Size() int64 { return r.size }

// basePage is the base's page at off: nil for a hole (zeros).
func (r *RAM) basePage(off int64) []byte {
	p := off / PageSize
	if r.data[p/64]&(1<<(p%64)) == 0 {
		return nil
	}
	return r.view[off : off+PageSize]
}

func (r *RAM) sum(b []byte) pageSum {
	return pageSum{maphash.Bytes(r.seed[0], b), maphash.Bytes(r.seed[1], b)}
}

// Parent is the snapshot the next checkpoint is written against.
func (r *RAM) Parent() servedram.Parent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.parent
}

// Published makes the snapshot c was written to the parent of the next
// checkpoint: its pages that differ from the base are c's.
func (r *RAM) Published(ctx context.Context, c *Capture, store stores.Store, to string, desc ocispec.Descriptor, st snapshot.WriteStats) {
	p := servedram.ReadParent(ctx, store, to, desc)
	if err := c.sumRest(); err != nil {
		// Those pages are not in the parent's own set: the next
		// checkpoint writes them again, as if changed.
		log.G(ctx).WithError(err).Warn("checkpoint of shared ram: some pages are written again next time")
	}
	r.mu.Lock()
	r.parent, r.own = p, c.own
	r.mu.Unlock()
	log.G(ctx).WithFields(log.Fields{"own_pages": len(c.own), "dirty_pages": len(c.dirty), "reused_chunks": st.Reused,
		"delta_chunks": st.Deltas, "uploaded_bytes": st.UploadedBytes}).Info("checkpoint of shared ram published")
}

// Close unmaps the base and closes it.
func (r *RAM) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	err := unix.Munmap(r.view)
	return errors.Join(err, r.base.Close())
}
