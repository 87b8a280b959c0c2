package vmm

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// MemoryMode says how a VM maps its guest RAM file and who owns the file.
type MemoryMode int

const (
	// MemoryOwned is a booted VM's RAM: a shared mapping (share=on, which
	// SaveState's x-ignore-shared keeps out of the device state) of a file
	// the machine creates before QEMU starts and removes on Shutdown. To
	// keep the RAM beyond Shutdown (checkpoint then stop), hard-link the
	// file first (tmpfs supports links; no copy).
	MemoryOwned MemoryMode = iota
	// MemoryPrivate is an eager restore's RAM: a private, copy-on-write
	// mapping (share=off) of the caller's materialized file, which a
	// confined QEMU gets its own copy of (Config.PrivateMemoryDir), or of
	// a sealed base that every clone of a node maps as is (Memory.Sealed).
	// A SaveState of it carries the whole RAM in the stream.
	MemoryPrivate
	// MemoryServed is a shared mapping of the caller's file on a page
	// server (pagefs), which decides itself which writes it takes and
	// keeps the set of dirty pages; no copy. A lazy restore's RAM
	// (Incoming) or a booted VM's served from zeros.
	MemoryServed
)

func (m MemoryMode) String() string {
	switch m {
	case MemoryOwned:
		return "owned"
	case MemoryPrivate:
		return "private"
	case MemoryServed:
		return "served"
	}
	return fmt.Sprintf("MemoryMode(%d)", int(m))
}

// Memory is a VM's guest RAM: how it is mapped and from which file.
type Memory struct {
	Mode MemoryMode
	// Path is the memory-backend-file mem-path (on tmpfs, e.g.
	// /dev/shm/cryo-<hash of the state dir>.ram, or a file of a pagefs
	// mount).
	Path string
	// Incoming says the VM is a restore: QEMU starts paused (-S) with
	// -incoming defer, for LoadState. A private mapping is always one; an
	// owned file never is; a served file is either (a booted VM whose RAM
	// a page server serves from zeros is not).
	Incoming bool
	// Sealed says Path is a sealed memfd (a node's shared base,
	// nodecache.Base) that a private mapping maps as is: no copy for a
	// confined QEMU, since its seals refuse every write, truncation and
	// hole punch through any descriptor, QEMU's own included. The machine
	// checks the seals before QEMU starts. Only with MemoryPrivate.
	Sealed bool
}

// Seals a sealed RAM file must carry: nothing can change its content or
// size, and no seal can be removed.
const Seals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// shared says QEMU maps the file share=on: its RAM stays out of a saved
// device state.
func (m Memory) shared() bool { return m.Mode != MemoryPrivate }

// owned says the machine creates and removes the file.
func (m Memory) owned() bool { return m.Mode == MemoryOwned }

// backend is the memory-backend-file object of a VM of sizeMiB whose RAM
// file QEMU gets as memPath (a passed descriptor).
func (m Memory) backend(sizeMiB int, memPath string) map[string]any {
	return map[string]any{
		"qom-type": "memory-backend-file",
		"id":       "ram0",
		"size":     int64(sizeMiB) << 20,
		"mem-path": memPath,
		"share":    m.shared(),
	}
}

// startArgs end QEMU's command line: a restore stays paused (-S) after
// the incoming migration; the caller resumes it.
func (m Memory) startArgs() []string {
	if m.Incoming {
		return []string{"-S", "-incoming", "defer"}
	}
	return nil
}

func (m Memory) validate() error {
	if m.Mode < MemoryOwned || m.Mode > MemoryServed {
		return fmt.Errorf("memory mode %v: want owned, private or served", m.Mode)
	}
	// The machine creates an owned file empty: there is nothing to
	// restore into it. A private mapping keeps the guest's writes out of
	// the file, which only a restore's materialized file wants.
	if m.Mode == MemoryOwned && m.Incoming {
		return fmt.Errorf("memory mode owned with incoming: an owned file is a booted vm's, not a restore's")
	}
	if m.Mode == MemoryPrivate && !m.Incoming {
		return fmt.Errorf("memory mode private without incoming: a private mapping is a restore's")
	}
	if m.Sealed && m.Mode != MemoryPrivate {
		return fmt.Errorf("memory mode %v sealed: only a private mapping maps a sealed file", m.Mode)
	}
	return nil
}

// checkSealed refuses a RAM file that lacks Seals: a QEMU given it could
// change what every other clone of the node reads.
func checkSealed(f *os.File) error {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("sealed ram file %s: seals: %w", f.Name(), err)
	}
	if seals&Seals != Seals {
		return fmt.Errorf("sealed ram file %s: seals %#x, want %#x", f.Name(), seals, Seals)
	}
	return nil
}
