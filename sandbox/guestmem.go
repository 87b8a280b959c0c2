package sandbox

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/sandbox/servedram"
	"github.com/cryo-runtime/cryo/sandbox/sharedram"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/vmm"
)

// guestMemory is a sandbox's guest RAM, one implementation per
// vmm.MemoryMode: ownedMemory (a booted VM's file), privateMemory (an
// eager restore's materialized file), servedMemory (a lazy restore's
// pagefs file) and sharedMemory (a shared clone's base, a private mapping
// too). Each says how the VM maps it, how a checkpoint takes it
// in the pause and publishes it, and how it ends; what a mode has no part
// in is a no-op.
type guestMemory interface {
	// configure gives the VM's config the RAM's mode and file.
	configure(c *vmm.Config)
	// started: QEMU runs, before the device state is loaded. A served
	// RAM stops vm from now on when a page cannot be served.
	started(vm machine)
	// restored: the restored guest runs. It returns what the restore's
	// log says of the RAM; a served RAM starts its prefetch.
	restored(ctx context.Context, prefetchWorkers int) log.Fields
	// interacted: the sandbox answered its first request.
	interacted()
	// failure is why the VM had to stop, when the RAM knows; nil
	// otherwise.
	failure() error

	// preSync readies a checkpoint before the pause, the guest running:
	// it writes back what the guest dirtied, so that the pause finds
	// little to do, and makes what capture takes, so that the pause
	// creates nothing.
	preSync() error
	// sync writes back, in the pause, what the guest dirtied since
	// preSync.
	sync() error
	// capture takes the RAM into the checkpoint in the pause, once the
	// device state is saved: exit says the VM ends after it.
	capture(c *capture, exit bool) error
	// writing adds to a checkpoint's write what the RAM needs beyond
	// the captured paths (md and wopts are the write's), and returns its
	// source files.
	writing(ctx context.Context, c *checkpointing, md *snapshot.Metadata, wopts *snapshot.WriteOptions) []snapshot.SourceFile
	// published: the checkpoint's snapshot is in the store.
	published(ctx context.Context, c *checkpointing, desc ocispec.Descriptor, st snapshot.WriteStats)
	// lost: a checkpoint failed after preSync. What preSync readied is
	// dropped and what c took of the RAM (if it got that far) given back:
	// a served RAM's sealed pages are written by the next checkpoint.
	lost(ctx context.Context, c *capture)

	// close ends the RAM once QEMU is gone (or failed to go: vmErr).
	close(ctx context.Context, vmErr error) error
}

// notServed is what a RAM that no page server serves does in guestMemory's
// served-only parts: nothing.
type notServed struct{}

func (notServed) preSync() error { return nil }
func (notServed) sync() error    { return nil }
func (notServed) writing(context.Context, *checkpointing, *snapshot.Metadata, *snapshot.WriteOptions) []snapshot.SourceFile {
	return nil
}
func (notServed) published(context.Context, *checkpointing, ocispec.Descriptor, snapshot.WriteStats) {
}
func (notServed) lost(context.Context, *capture)     {}
func (notServed) started(machine)                    {}
func (notServed) interacted()                        {}
func (notServed) failure() error                     { return nil }
func (notServed) close(context.Context, error) error { return nil }

// ownedMemory is a booted VM's RAM: a file in the memory dir that the
// machine creates and removes, mapped shared, so that the device state
// carries none of it.
type ownedMemory struct {
	notServed
	path string
}

func (m *ownedMemory) configure(c *vmm.Config) {
	c.Memory = vmm.Memory{Mode: vmm.MemoryOwned, Path: m.path}
}

func (m *ownedMemory) restored(context.Context, int) log.Fields { return nil }

// capture links the file (exit: the VM ends, the link keeps its pages)
// or copies it.
func (m *ownedMemory) capture(c *capture, exit bool) error { return c.takeRAM(m.path, exit) }

// privateMemory is an eager restore's RAM: the snapshot's materialized
// file (or an empty one, when the snapshot's RAM is in its device
// state), mapped privately. The node cache owns the file; the sandbox's
// use of it ends with releaseSnapshot.
type privateMemory struct {
	notServed
	path string
}

func (m *privateMemory) configure(c *vmm.Config) {
	c.Memory = vmm.Memory{Mode: vmm.MemoryPrivate, Path: m.path, Incoming: true}
}

func (m *privateMemory) restored(context.Context, int) log.Fields {
	return log.Fields{"mode": RestoreEager}
}

// capture leaves the RAM to the device state: a private mapping is not
// ignored by x-ignore-shared, so the stream carried it.
func (m *privateMemory) capture(c *capture, _ bool) error {
	c.record.RAMInStream = true
	return nil
}

// servedMemory is a lazy restore's RAM, served from the snapshot by
// pagefs (servedram), or a booted sandbox's served from zeros
// (servedram.ServeZero, [memory] booted = "served"): QEMU maps the
// sandbox's own layered file shared, writes through to the server, which
// keeps the dirty set a checkpoint writes against its parent (for a
// booted RAM's first checkpoint, zeros).
type servedMemory struct {
	ram *servedram.RAM
	// booted: the VM boots on the RAM, no state comes in.
	booted bool
}

func (m *servedMemory) configure(c *vmm.Config) {
	c.Memory = vmm.Memory{Mode: vmm.MemoryServed, Path: m.ram.Path(), Incoming: !m.booted}
	c.AdmitUID = m.ram.Admit // pagefs opens to QEMU's uid alone
}

func (m *servedMemory) started(vm machine) { m.ram.SetKill(vm.Kill) }

func (m *servedMemory) restored(ctx context.Context, workers int) log.Fields {
	log.G(ctx).WithFields(m.ram.FetchedFields()).Info("lazy restore: fetched before the guest ran")
	m.ram.StartPrefetch(ctx, workers)
	return log.Fields{"mode": RestoreLazy}
}

func (m *servedMemory) interacted()    { m.ram.Interacted() }
func (m *servedMemory) failure() error { return m.ram.Err() }

func (m *servedMemory) preSync() error { return m.ram.PreSync() }
func (m *servedMemory) sync() error    { return m.ram.Sync() }

// capture seals the RAM's content: nothing of it is copied in the pause,
// the device state carries none of it (x-ignore-shared), and nothing is
// created (preSync made the side file).
func (m *servedMemory) capture(c *capture, _ bool) (err error) {
	if c.gen, err = m.ram.Seal(); err != nil {
		return fmt.Errorf("seal guest ram: %w", err)
	}
	return nil
}

// writing writes the sealed RAM as its parent's chunks and the pages the
// guest wrote since (snapshot.IncrementalSourceFile), at the parent's
// chunk size, with the working set the next lazy restore prefetches
// first.
func (m *servedMemory) writing(ctx context.Context, c *checkpointing, md *snapshot.Metadata, wopts *snapshot.WriteOptions) []snapshot.SourceFile {
	if c.cap.gen == nil {
		return nil
	}
	wopts.ChunkSize = m.ram.ChunkSize(ctx, wopts.ChunkSize)
	md.WorkingSet = m.ram.WorkingSet(wopts.ChunkSize)
	wopts.ParentReads = c.parentReads(ctx)
	return []snapshot.SourceFile{snapshot.IncrementalSourceFile(snapshot.FileRAM, c.cap.gen, m.ram.WriteParent(*wopts))}
}

// published makes the snapshot the parent of the next checkpoint.
func (m *servedMemory) published(ctx context.Context, c *checkpointing, desc ocispec.Descriptor, st snapshot.WriteStats) {
	if c.cap.gen == nil {
		return
	}
	gen := c.cap.gen
	c.cap.gen = nil
	m.ram.Published(ctx, gen, c.store, c.to, desc, st)
}

// lost abandons the sealed generation: its pages stay for the next
// checkpoint, which is written against the last snapshot published.
func (m *servedMemory) lost(ctx context.Context, c *capture) {
	m.ram.LostGeneration(ctx, c.gen)
	c.gen = nil
}

func (m *servedMemory) close(ctx context.Context, vmErr error) error {
	if vmErr != nil {
		// A QEMU stuck on a page read exits once the reads fail.
		m.ram.Abort(ctx)
	}
	return m.ram.Close(ctx)
}

// parentReads is the node cache over the target store: the parent chunks
// a delta is made against were fetched there by the restore (or its
// prefetch). Without a node cache they are read from the store.
func (c *checkpointing) parentReads(ctx context.Context) stores.Store {
	n := c.sb.spec.Node
	err := errNoNodeCache
	var cs *nodecache.CachingStore
	if n.Cache != nil {
		cs, err = n.Cache.Store(c.store, n.Stores.CachingOptions(c.to))
	}
	if err != nil {
		log.G(ctx).WithError(err).Warn("checkpoint of served ram: no node cache, parent chunks are read from the store")
		return nil
	}
	return cs
}

// sharedMemory is a shared clone's RAM (sharedram): the node's base of
// its snapshot, mapped privately. QEMU streams the RAM with the device
// state; a checkpoint splits it out in the pause and writes what differs
// from the last snapshot published, as a served RAM's.
type sharedMemory struct {
	notServed
	ram *sharedram.RAM
}

func (m *sharedMemory) configure(c *vmm.Config) {
	c.Memory = vmm.Memory{Mode: vmm.MemoryPrivate, Path: m.ram.Path(), Incoming: true, Sealed: true}
}

func (m *sharedMemory) restored(context.Context, int) log.Fields {
	return log.Fields{"mode": RestoreShared}
}

func (m *sharedMemory) splitState(ctx context.Context, c *capture, state io.Reader, out io.Writer) (err error) {
	t0 := time.Now()
	if c.pages, err = m.ram.Split(state, out); err != nil {
		return err
	}
	st := c.pages.Stats()
	log.G(ctx).WithFields(log.Fields{"stream_bytes": st.In, "device_state_bytes": st.Out, "own_pages": c.pages.OwnPages(),
		"dirty_pages": len(c.pages.Pages()), "duration": time.Since(t0)}).Debug("shared ram split from the device state")
	return nil
}

// capture has nothing left to take: splitState kept the pages.
func (m *sharedMemory) capture(*capture, bool) error { return nil }

func (m *sharedMemory) writing(ctx context.Context, c *checkpointing, _ *snapshot.Metadata, wopts *snapshot.WriteOptions) []snapshot.SourceFile {
	if c.cap.pages == nil {
		return nil
	}
	p := m.ram.Parent()
	wopts.ChunkSize = p.WriteChunkSize(ctx, wopts.ChunkSize)
	wopts.ParentReads = c.parentReads(ctx)
	return []snapshot.SourceFile{snapshot.IncrementalSourceFile(snapshot.FileRAM, c.cap.pages, p.ForWrite())}
}

func (m *sharedMemory) published(ctx context.Context, c *checkpointing, desc ocispec.Descriptor, st snapshot.WriteStats) {
	if c.cap.pages == nil {
		return
	}
	m.ram.Published(ctx, c.cap.pages, c.store, c.to, desc, st)
	c.cap.pages.Close()
	c.cap.pages = nil
}

// lost drops the pages taken: the parent stays the last snapshot
// published, against which the next checkpoint compares.
func (m *sharedMemory) lost(_ context.Context, c *capture) {
	if c.pages != nil {
		c.pages.Close()
		c.pages = nil
	}
}

func (m *sharedMemory) close(context.Context, error) error { return m.ram.Close() }
