package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/internal/redact"
	"github.com/cryo-runtime/cryo/network"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/sandbox/servedram"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/vmm"
)

// Source is where a restore comes from.
type Source struct {
	URL    string
	Digest string // optional pin of the manifest
	// Trusted sources were written by containerd itself (a checkpoint
	// image it extracted for Create): the allowlist, which guards
	// annotations, does not apply.
	Trusted bool
}

// Restored is what Restore returns beside the sandbox: the guest
// containers the snapshot holds, running, for the tasks that take them over
// (Adopt).
type Restored struct {
	// SandboxID is the id the checkpointed sandbox had: the guest id of
	// its own container.
	SandboxID  string
	Containers []RecordContainer
	// Finished are the CRI names of the source pod's containers that had
	// run and ended (init containers).
	Finished []string
}

// restoring is what a restore's own steps made.
type restoring struct {
	node    *nodecache.Node
	snap    *snapshot.Snapshot
	rec     *sandboxRecord
	digests guestDigests
	mat     *snapshot.Materialized
	release func()
}

// Restore resolves, fetches, verifies and materializes the snapshot,
// checks it against this host, starts the VM from it and connects to its
// agent. On failure nothing is left running and no partial file remains
// (the cache only ever holds verified, complete entries).
func Restore(ctx context.Context, spec Spec, src Source) (*Sandbox, *Restored, error) {
	// Logged before the allowlist refuses what a URL must not carry.
	ctx = log.WithLogger(ctx, log.G(ctx).WithFields(log.Fields{"sandbox": spec.ID, "restore_from": redact.URL(src.URL)}))
	st := &start{Spec: spec, src: src, restore: &restoring{}, vms: qemuFactory}
	if err := st.run(ctx, "restore", st.restoreSteps()); err != nil {
		return nil, nil, err
	}
	r := st.restore
	sb := st.finish(ctx, &Sandbox{spec: spec, rootfs: newRootfsBuilder(spec.Node.RootFS), restoredFrom: src.URL, releaseSnapshot: r.release,
		guestID: r.rec.SandboxID})
	rs := &Restored{SandboxID: r.rec.SandboxID, Containers: r.rec.Containers, Finished: r.rec.Finished}
	memFields := st.mem.restored(ctx, spec.Node.Lazy.PrefetchWorkers)
	log.G(ctx).WithFields(log.Fields{"boot_id": st.info.BootID, "digest": r.snap.Descriptor.Digest, "qemu_pid": st.vm.Pid()}).WithFields(memFields).Info("sandbox restored")
	return sb, rs, nil
}

// restoreSteps are a restore's steps: the snapshot resolved, checked and
// fetched before anything runs, then the VM started from it and the guest
// given the new pod's clock and network. Floor runs a part of them.
func (st *start) restoreSteps() []step {
	return slices.Concat(
		st.fetchSteps(),
		[]step{{"pod network", st.restoredNetwork}},
		st.machineSteps(),
		st.resumeSteps(),
		[]step{
			{"fix up guest", func(ctx context.Context, _ *undo) error { return st.agent.fixUpRestored(ctx) }},
			// The new pod's MAC, addresses and routes, before any hook or
			// task runs; only then do the guest's frames reach the pod
			// network.
			{"guest network", st.guestNetwork},
			{"release network", func(ctx context.Context, _ *undo) error { return st.pn.releaseGuest(ctx) }},
			{"post-restore hook", st.postRestore},
		})
}

// postRestore runs the pod's post-restore hook in the checkpointed
// sandbox's own container (in a pod, the one that booted the VM), before
// any task takes a container over. Its failure is a HookError: the
// snapshot restored, and the pod's own hook refused it.
func (st *start) postRestore(ctx context.Context, _ *undo) error {
	if err := runHook(ctx, st.agent, st.restore.rec.SandboxID, st.PostRestore, "post-restore"); err != nil {
		return &HookError{Err: err}
	}
	return nil
}

// HookError is a Restore that failed in the pod's post-restore hook: a
// cold boot instead (restore-fallback) would run the pod without the
// hook's say.
type HookError struct{ Err error }

func (e *HookError) Error() string { return e.Err.Error() }
func (e *HookError) Unwrap() error { return e.Err }

// fetchSteps find the snapshot, check it against this host and fetch it.
func (st *start) fetchSteps() []step {
	fetch := step{"fetch+materialize", st.materialize}
	switch {
	case st.Node.VM.SharedClones:
		fetch = step{"fetch+share", st.share}
	case st.RestoreMode == RestoreLazy:
		fetch = step{"fetch+serve", st.serve}
	}
	return []step{{"resolve", st.resolve}, {"check host", st.checkHost}, fetch}
}

// machineSteps build the checkpointed VM on this host, not yet started.
func (st *start) machineSteps() []step {
	return []step{
		{"vm config", st.restoreConfig},
		{"vm", st.newVM},
		{"fingerprint", func(ctx context.Context, _ *undo) error {
			return stepErr("snapshot does not fit this host", st.vm.CheckRestore(st.restore.snap.Metadata.Fingerprint))
		}},
	}
}

// resumeSteps start QEMU, load the device state and run the guest until
// its agent answers.
func (st *start) resumeSteps() []step {
	return []step{
		{"qemu", st.startQEMU},
		{"load state", st.loadState},
		{"continue", func(ctx context.Context, _ *undo) error { return st.vm.Resume(ctx) }},
		{"agent", st.connectAgent},
	}
}

// resolve opens the snapshot through the node cache and decodes every field
// of its record, before anything is created.
func (st *start) resolve(ctx context.Context, _ *undo) error {
	n, src := st.Node, st.src
	if !src.Trusted {
		if err := n.Stores.Allows(src.URL, st.Tenant); err != nil {
			return err
		}
	}
	store, ref, err := stores.Open(ctx, src.URL, storeOptions(n.Stores, st.Tenant, src.URL, src.Trusted))
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	if ref, err = pinRef(ref, src.Digest); err != nil {
		return err
	}
	node, err := n.Cache, errNoNodeCache
	var cached *nodecache.CachingStore
	if node != nil {
		cached, err = node.Store(store, n.Stores.CachingOptions(src.URL))
	}
	if err != nil {
		return fmt.Errorf("node cache: %w", err)
	}
	ropts, err := n.Keys.ReadOptions(st.Tenant)
	if err != nil {
		return err
	}
	ropts.RefuseExpired = true
	nodeReadLimits(&ropts, n.Limits)
	snap, err := snapshot.Open(ctx, cached, ref, ropts)
	if err != nil {
		return fmt.Errorf("%s: %w", redact.URL(src.URL), err)
	}
	rec, err := readRecord(ctx, snap, n.Limits)
	if err != nil {
		return err
	}
	if st.FitsPod != nil {
		if err := st.FitsPod(rec.VCPUs, rec.MemoryMiB); err != nil {
			return err
		}
	}
	st.restore.node, st.restore.snap, st.restore.rec = node, snap, rec
	return nil
}

// checkHost compares the snapshot's VM with what this host would run,
// before the snapshot is downloaded (the fingerprint step checks the VM
// built from it again, its devices included).
func (st *start) checkHost(ctx context.Context, _ *undo) error {
	t := st.Node.VM
	digests, err := hostGuestDigests(st.Node)
	if err == nil {
		digests.qemu, err = st.restore.node.Facts().QEMUVersion(t.QEMUPath)
	}
	if err == nil {
		host := vmm.Config{QEMUPath: t.QEMUPath, Kernel: t.Kernel, Initrd: t.Initrd, MachineType: t.MachineType, CPUModel: t.CPUModel, Accel: t.Accel}
		err = vmm.CheckHost(digests.apply(host), st.restore.snap.Metadata.Fingerprint)
	}
	if err != nil {
		return fmt.Errorf("snapshot does not fit this host: %w", err)
	}
	st.restore.digests = digests
	return nil
}

// materialize makes the snapshot's files on the node, once per node. The
// sandbox uses them for as long as it runs: its QEMU maps the RAM file, its
// overlays name the disks as backing files. `cryoctl gc` leaves them alone
// until the sandbox releases them.
func (st *start) materialize(ctx context.Context, u *undo) error {
	r := st.restore
	release, err := r.node.Snapshots().Use(ctx, r.snap.Descriptor.Digest)
	if err != nil {
		return err
	}
	u.onFailure(func(context.Context) { release() })
	m, err := r.snap.Materialize(ctx, r.node.Snapshots())
	if err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{"cache_hit": m.CacheHit, "digest": r.snap.Descriptor.Digest}).Info("snapshot materialized")
	r.mat, r.release = m, release
	st.mem = &privateMemory{path: m.RAM}
	return nil
}

// serve is a lazy restore's fetch: the device state is fetched and
// verified, the RAM and base disks are mounted from the snapshot (pagefs),
// page by page on demand. Like materialize, it holds the snapshot's
// use-lock for the sandbox's life, so `cryoctl gc` leaves it alone. A
// snapshot whose RAM travels in its device state has nothing to serve and
// is materialized.
func (st *start) serve(ctx context.Context, u *undo) error {
	r := st.restore
	if r.rec.RAMInStream {
		log.G(ctx).Info("lazy restore: the snapshot's RAM is in its device state; restoring eagerly")
		return st.materialize(ctx, u)
	}
	release, err := r.node.Snapshots().Use(ctx, r.snap.Descriptor.Digest)
	if err != nil {
		return err
	}
	u.onFailure(func(context.Context) { release() })
	if err := os.MkdirAll(st.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	// Before QEMU starts: a device state that does not verify stops the
	// restore while restore-fallback can still boot the pod cold.
	devState, err := st.fetchDevState(ctx, u)
	if err != nil {
		return err
	}
	var disks []string
	for _, d := range r.rec.Disks {
		disks = append(disks, d.Name)
	}
	ram, err := servedram.Serve(ctx, r.snap, servedram.Options{
		StoreURL: st.src.URL, StateDir: st.StateDir, Layer: layerPath(st.Node.VM.MemoryDir, st.StateDir), Disks: disks,
		PageTimeout: st.Node.Lazy.PageTimeout, StuckGrace: stuckGrace, PrefetchDelay: prefetchDelay,
	})
	if err != nil {
		return fmt.Errorf("serve ram and disks: %w", err)
	}
	// Pushed before QEMU's shutdown: the undo stack kills QEMU first.
	u.onFailure(func(ctx context.Context) {
		if err := ram.Close(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("lazy restore: unmount served ram")
		}
	})
	ram.KeepBlobs(ctx, r.node, r.snap.Descriptor.Digest)
	m := &snapshot.Materialized{ManifestDigest: r.snap.Descriptor.Digest, RAM: ram.Path(), DevState: devState, Disks: map[string]string{}}
	for _, name := range disks {
		m.Disks[name], _ = ram.Disk(name)
	}
	r.mat, r.release = m, release
	st.mem = &servedMemory{ram: ram}
	return nil
}

// fetchDevState streams a lazy restore's device state, verified, from
// the store to <stateDir>/devstate.in, a chunk at a time. It holds no RAM
// (x-ignore-shared): some MiB of device registers and queues, at most
// [restore] max_device_state. On error nothing is left.
func (st *start) fetchDevState(ctx context.Context, u *undo) (string, error) {
	limit := st.Node.Limits.MaxDeviceState
	for _, f := range st.restore.snap.Metadata.Files {
		if f.Name == snapshot.FileDevState && f.Size > limit {
			return "", fmt.Errorf("device state of %d bytes, this node allows at most %d MiB (restore.max_device_state): %w",
				f.Size, limit>>20, errdefs.ErrInvalidArgument)
		}
	}
	path := filepath.Join(st.StateDir, "devstate.in")
	// A dead shim's restore of this sandbox may have left one.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("device state: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("device state: %w", err)
	}
	u.cleanup(func(context.Context) { os.Remove(path) })
	err = st.restore.snap.CopyFile(ctx, snapshot.FileDevState, limit, f)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("device state: %w", cerr)
	}
	if err != nil {
		return "", fmt.Errorf("device state: %w", err)
	}
	return path, nil
}

// restoreConfig is the checkpointed VM's configuration on this host, with
// the new pod's NIC.
func (st *start) restoreConfig(ctx context.Context, u *undo) error {
	r := st.restore
	// What restoredVMConfig makes, should a later step fail: the VM
	// would have owned it.
	u.onFailure(func(context.Context) {
		os.Remove(filepath.Join(st.StateDir, emptyRAMName))
		for _, d := range r.rec.Disks {
			os.RemoveAll(filepath.Join(st.DiskDir, d.ID))
		}
	})
	c, err := restoredVMConfig(ctx, st.ID, st.Node.VM, r.rec, r.mat, st.mem, st.StateDir, st.DiskDir)
	if err != nil {
		return err
	}
	c.NICs = st.pn.nics()
	st.vmcfg = confined(r.digests.apply(c), st.Node.VM)
	return nil
}

// loadState loads the snapshot's device state into the paused QEMU.
func (st *start) loadState(ctx context.Context, _ *undo) error {
	st.mem.started(st.vm)
	f, err := os.Open(st.restore.mat.DevState)
	if err != nil {
		return err
	}
	defer f.Close()
	return st.vm.LoadState(ctx, f)
}

// restoredNetwork gives a restored VM the network of the new pod: the same
// NIC (device id and slot) as at checkpoint, which takes the MAC of the new
// pod's veth once the guest answers. The VM's device layout must match the snapshot's, so a
// snapshot with a NIC needs a pod network and one without refuses one.
func (st *start) restoredNetwork(ctx context.Context, u *undo) error {
	pn, err := restoredNetwork(ctx, st.Pod, st.restore.rec)
	if err != nil {
		return err
	}
	st.pn = pn
	u.onFailure(pn.teardown)
	return nil
}

func restoredNetwork(ctx context.Context, spec *specs.Spec, rec *sandboxRecord) (*podNetwork, error) {
	has := podNetNS(spec) != ""
	switch {
	case rec.NICMAC == "" && has:
		return nil, fmt.Errorf("the snapshot's vm had no network interface, this pod has a network namespace: %w", errdefs.ErrFailedPrecondition)
	case rec.NICMAC == "":
		return nil, nil
	case !has:
		return nil, fmt.Errorf("the snapshot's vm had a pod network interface, this sandbox has no network namespace: %w", errdefs.ErrFailedPrecondition)
	}
	if _, err := net.ParseMAC(rec.NICMAC); err != nil {
		return nil, fmt.Errorf("snapshot nic mac %q: %w", rec.NICMAC, errdefs.ErrDataLoss)
	}
	// The veth keeps its own MAC and the guest NIC takes it (configureGuest):
	// clones of one snapshot on one bridge must not share an address. Until
	// then the guest's frames are held back, or its first one would carry
	// the source's MAC onto the bridge.
	pn, err := setupNetwork(ctx, spec, network.Options{HoldGuest: true})
	if err != nil {
		return nil, err
	}
	if pn == nil {
		return nil, fmt.Errorf("the snapshot's vm had a pod network interface, this pod's network namespace has none: %w", errdefs.ErrFailedPrecondition)
	}
	return pn, nil
}

// pinRef adds a pinned manifest digest to a reference.
func pinRef(ref, pin string) (string, error) {
	if pin == "" {
		return ref, nil
	}
	tag, have, err := snapshot.ParseRef(ref)
	if err != nil {
		return "", err
	}
	if have != "" && have.String() != pin {
		return "", fmt.Errorf("reference pins %s but %s asks for %s: %w", have, annotations.RestoreDigest, pin, errdefs.ErrInvalidArgument)
	}
	if tag == "" {
		return pin, nil
	}
	return tag + "@" + pin, nil
}

// emptyRAMName is the RAM file, in the state dir, of a VM whose RAM comes
// in its device state.
const emptyRAMName = "ram.empty"

// restoredVMConfig rebuilds the checkpointed VM's configuration: its size
// and device layout from the record, this host's QEMU and guest files, RAM
// as mem maps it, and a new qcow2 overlay per disk on the materialized or
// served (read-only, shared) base.
func restoredVMConfig(ctx context.Context, id string, t VMTemplate, rec *sandboxRecord, m *snapshot.Materialized, mem guestMemory, stateDir, diskDir string) (vmm.Config, error) {
	c := t.config(id, stateDir)
	c.VCPUs, c.MemoryMiB, c.HotplugPorts = rec.VCPUs, rec.MemoryMiB, rec.HotplugPort
	mem.configure(&c)
	if rec.RAMInStream || m.RAM == "" {
		// RAM comes in the device state: map an empty sparse file.
		c.Memory.Path = filepath.Join(stateDir, emptyRAMName)
		if err := os.WriteFile(c.Memory.Path, nil, 0o600); err != nil {
			return c, err
		}
		if err := os.Truncate(c.Memory.Path, int64(rec.MemoryMiB)<<20); err != nil {
			return c, err
		}
	}
	for _, d := range rec.Disks {
		base, ok := m.Disks[d.Name]
		if !ok {
			return c, fmt.Errorf("snapshot has no disk %q: %w", d.Name, errdefs.ErrDataLoss)
		}
		dir := filepath.Join(diskDir, d.ID)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return c, err
		}
		overlay := filepath.Join(dir, "restored.qcow2")
		if err := createOverlay(ctx, base, overlay); err != nil {
			return c, fmt.Errorf("overlay for disk %s: %w", d.Name, err)
		}
		c.Disks = append(c.Disks, vmm.Disk{ID: d.ID, Serial: d.Serial, Port: d.Port, Path: overlay, Format: "qcow2", ReadOnly: d.ReadOnly})
	}
	return c, nil
}

// guestDigests are the sha256 digests ("sha256:<hex>") of the guest
// kernel and initrd, from the node's host facts, so that no shim hashes the
// files again: a restore compares them with the snapshot's, and the VM's
// fingerprint, which a checkpoint records inside its pause window, needs
// them. A restore adds QEMU's version (the VM's fingerprint before Start).
type guestDigests struct{ kernel, initrd, qemu string }

func hostGuestDigests(n Node) (guestDigests, error) {
	if n.Cache == nil {
		return guestDigests{}, errNoNodeCache
	}
	g, err := n.Cache.Facts().GuestDigests(n.VM.Kernel, n.VM.Initrd)
	return guestDigests{kernel: g.Kernel, initrd: g.Initrd}, err
}

// apply gives the VM config the digests (vmm takes them in hex) and the
// QEMU version.
func (g guestDigests) apply(c vmm.Config) vmm.Config {
	c.KernelSHA256 = strings.TrimPrefix(g.kernel, "sha256:")
	c.InitrdSHA256 = strings.TrimPrefix(g.initrd, "sha256:")
	c.QEMUVersion = g.qemu
	return c
}

// Adopt takes over the guest container rc of a restored sandbox for a new
// task: it returns the pid of its init, running since before the
// checkpoint, and gives the container hostname when the new pod has
// another.
func (s *Sandbox) Adopt(ctx context.Context, rc RecordContainer, hostname string) (uint32, error) {
	infos, err := s.agent.listContainers(ctx)
	if err != nil {
		return 0, fmt.Errorf("restore: list guest containers: %w", err)
	}
	var pid uint32
	for _, in := range infos {
		if in.Id == rc.GuestID {
			pid = in.InitPid
		}
	}
	if pid == 0 {
		return 0, fmt.Errorf("restore: guest has no running container %s: %w", rc.GuestID, errdefs.ErrNotFound)
	}
	if hostname != "" && hostname != rc.Spec.Hostname {
		if _, _, err := s.agent.runHook(ctx, rc.GuestID, []string{"hostname", hostname}, hostnameTimeout); err != nil {
			return 0, fmt.Errorf("restore: set hostname: %w", err)
		}
	}
	return pid, nil
}
