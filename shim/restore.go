package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/fetch"
	"github.com/cryo-runtime/cryo/internal/redact"
	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/network"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/vmm"
)

// restoreSource is where a restore comes from.
type restoreSource struct {
	URL    string
	Digest string // optional pin of the manifest
	// Trusted sources were written by containerd itself (a checkpoint
	// image it extracted for Create): the allowlist, which guards
	// annotations, does not apply.
	Trusted bool
}

// restoredSandbox is what restoreSandbox returns beside the sandbox: the
// guest containers waiting for a task to claim them.
type restoredSandbox struct {
	record  *sandboxRecord
	pending map[string]recordContainer // by guest id
	mu      sync.Mutex
}

// claim returns the guest container that a new task takes over: the one
// with the same CRI container name, else the sandbox's own container for
// the sandbox's first task.
func (r *restoredSandbox) claim(spec map[string]string, first bool) (recordContainer, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := spec[criContainerName]
	for id, rc := range r.pending {
		if name != "" && rc.Name == name || first && id == r.record.SandboxID {
			delete(r.pending, id)
			return rc, true
		}
	}
	if first && len(r.pending) == 1 {
		for id, rc := range r.pending {
			delete(r.pending, id)
			return rc, true
		}
	}
	return recordContainer{}, false
}

// restoreSandbox resolves, fetches, verifies and materializes the snapshot,
// checks it against this host, and starts the VM from it. Each phase is
// timed. On failure nothing is left running and no partial file remains
// (the cache only ever holds verified, complete entries).
func (s *service) restoreSandbox(ctx context.Context, id string, spec *specs.Spec, cfg configs.Config, src restoreSource, stateDir, diskDir string) (_ *sandbox, _ *restoredSandbox, retErr error) {
	// Logged before the allowlist refuses what a URL must not carry.
	ctx = log.WithLogger(ctx, log.G(ctx).WithFields(log.Fields{"sandbox": id, "restore_from": redact.URL(src.URL)}))
	total := time.Now()
	phase := func(name string, t0 time.Time) {
		log.G(ctx).WithFields(log.Fields{"phase": name, "duration": time.Since(t0)}).Info("restore phase")
	}

	t0 := time.Now()
	tenant := s.tenant(spec.Annotations)
	if !src.Trusted {
		if err := cfg.Stores.Allows(src.URL, tenant); err != nil {
			return nil, nil, err
		}
	}
	store, ref, err := fetch.Open(ctx, src.URL, storeOptions(cfg, tenant, src.URL, src.Trusted))
	if err != nil {
		return nil, nil, fmt.Errorf("restore: open store: %w", err)
	}
	if ref, err = pinRef(ref, src.Digest); err != nil {
		return nil, nil, err
	}
	cache, err := fetch.NewCache(cfg.Snapshot.BlobDir(), cfg.Snapshot.CacheMaxMiB<<20)
	if err != nil {
		return nil, nil, fmt.Errorf("restore: node cache: %w", err)
	}
	ropts, err := cfg.Snapshot.ReadOptions(tenant)
	if err != nil {
		return nil, nil, err
	}
	ropts.RefuseExpired = true
	nodeReadLimits(&ropts, cfg)
	snap, err := snapshot.Open(ctx, fetch.NewCachingStore(store, cache, fetch.CachingOptions{}), ref, ropts)
	if err != nil {
		return nil, nil, fmt.Errorf("restore from %s: %w", src.URL, err)
	}
	// Every field of the snapshot is decoded before anything is created.
	rec, err := readRecord(ctx, snap, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("restore from %s: %w", src.URL, err)
	}
	if err := annotations.CheckRestoredSize(spec.Annotations, cfg, rec.VCPUs, rec.MemoryMiB); err != nil {
		return nil, nil, fmt.Errorf("restore from %s: %w", src.URL, err)
	}
	phase("resolve", t0)

	t0 = time.Now()
	digests, err := hostGuestDigests(cfg)
	if err == nil {
		err = checkHost(cfg, snap.Metadata.Fingerprint, digests)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("restore from %s: snapshot does not fit this host: %w", src.URL, err)
	}
	phase("check", t0)

	t0 = time.Now()
	// The sandbox uses the materialized files for as long as it runs: its
	// QEMU maps the RAM file, its overlays name the disks as backing
	// files. `cryoctl gc` leaves them alone until the shim releases them.
	matDir := cfg.Snapshot.MaterializedDir()
	release, err := snapshot.Use(ctx, matDir, snap.Descriptor.Digest)
	if err != nil {
		return nil, nil, fmt.Errorf("restore from %s: %w", src.URL, err)
	}
	defer func() {
		if retErr != nil {
			release()
		}
	}()
	m, err := snap.Materialize(ctx, matDir)
	if err != nil {
		return nil, nil, fmt.Errorf("restore from %s: %w", src.URL, err)
	}
	log.G(ctx).WithFields(log.Fields{"phase": "fetch+materialize", "duration": time.Since(t0), "cache_hit": m.CacheHit, "digest": snap.Descriptor.Digest}).Info("restore phase")

	t0 = time.Now()
	vmcfg, err := restoredVMConfig(ctx, id, cfg, rec, m, stateDir, diskDir)
	if err != nil {
		return nil, nil, err
	}
	pn, err := restoredNetwork(ctx, spec, rec)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if retErr != nil {
			pn.teardown(context.WithoutCancel(ctx))
		}
	}()
	vmcfg.NICs = pn.nics()
	vm, err := vmm.New(confined(digests.apply(vmcfg), cfg))
	if err != nil {
		return nil, nil, err
	}
	if err := vm.Fingerprint().CheckRestore(rec.Fingerprint); err != nil {
		return nil, nil, fmt.Errorf("restore from %s: %w", src.URL, err)
	}
	if err := vm.Start(ctx); err != nil {
		return nil, nil, err
	}
	defer func() {
		if retErr != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = vm.Shutdown(sctx)
		}
	}()
	f, err := os.Open(m.DevState)
	if err != nil {
		return nil, nil, err
	}
	err = vm.LoadState(ctx, f)
	f.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("restore from %s: load device state: %w", src.URL, err)
	}
	if err := vm.Resume(ctx); err != nil {
		return nil, nil, fmt.Errorf("restore: continue vm: %w", err)
	}
	phase("start", t0)

	t0 = time.Now()
	ag, info, err := connectAgent(ctx, vm, cfg.Agent)
	if err != nil {
		return nil, nil, err
	}
	sb := &sandbox{
		id: id, cfg: cfg, stateDir: stateDir, diskDir: diskDir, vm: vm, agent: ag, info: info, restoredFrom: src.URL, net: pn,
		releaseSnapshot: release,
		rootfs:          &rootfsBuilder{cacheDir: cfg.Runtime.ImageCache, writableMiB: cfg.Runtime.WritableDiskMiB},
	}
	log.G(ctx).WithField("duration", time.Since(t0)).Debug("restored guest agent answered")
	if err := ag.fixUpRestored(ctx); err != nil {
		ag.close()
		return nil, nil, fmt.Errorf("restore: fix up guest: %w", err)
	}
	// The new pod's MAC, addresses and routes, before any hook or task
	// runs; only then do the guest's frames reach the pod network.
	if err := pn.configureGuest(ctx, ag); err != nil {
		ag.close()
		return nil, nil, fmt.Errorf("restore: %w", err)
	}
	if err := pn.releaseGuest(ctx); err != nil {
		ag.close()
		return nil, nil, fmt.Errorf("restore: %w", err)
	}
	rs := &restoredSandbox{record: rec, pending: map[string]recordContainer{}}
	for _, rc := range rec.Containers {
		rs.pending[rc.GuestID] = rc
	}
	phase("guest", t0)
	log.G(ctx).WithFields(log.Fields{
		"duration": time.Since(total), "boot_id": info.BootID, "digest": snap.Descriptor.Digest, "qemu_pid": vm.Pid(),
	}).Info("sandbox restored")
	return sb, rs, nil
}

// restoredNetwork gives a restored VM the network of the new pod: the same
// NIC (device id and slot) as at checkpoint, which takes the MAC of the new
// pod's veth once the guest answers. The VM's device layout must match the snapshot's, so a
// snapshot with a NIC needs a pod network and one without refuses one.
func restoredNetwork(ctx context.Context, spec *specs.Spec, rec *sandboxRecord) (*podNetwork, error) {
	has := podNetNS(spec) != ""
	switch {
	case rec.NICMAC == "" && has:
		return nil, fmt.Errorf("restore: the snapshot's vm had no network interface, this pod has a network namespace: %w", errdefs.ErrFailedPrecondition)
	case rec.NICMAC == "":
		return nil, nil
	case !has:
		return nil, fmt.Errorf("restore: the snapshot's vm had a pod network interface, this sandbox has no network namespace: %w", errdefs.ErrFailedPrecondition)
	}
	if _, err := net.ParseMAC(rec.NICMAC); err != nil {
		return nil, fmt.Errorf("restore: snapshot nic mac %q: %w", rec.NICMAC, errdefs.ErrDataLoss)
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
		return nil, fmt.Errorf("restore: the snapshot's vm had a pod network interface, this pod's network namespace has none: %w", errdefs.ErrFailedPrecondition)
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
		return "", fmt.Errorf("restore: reference pins %s but %s asks for %s: %w", have, annotations.RestoreDigest, pin, errdefs.ErrInvalidArgument)
	}
	if tag == "" {
		return pin, nil
	}
	return tag + "@" + pin, nil
}

// restoredVMConfig rebuilds the checkpointed VM's configuration: its size
// and device layout from the record, this host's QEMU and guest files, RAM
// mapped privately from the materialized file, and a new qcow2 overlay per
// disk on the materialized (read-only, shared) base.
func restoredVMConfig(ctx context.Context, id string, cfg configs.Config, rec *sandboxRecord, m *snapshot.Materialized, stateDir, diskDir string) (vmm.Config, error) {
	h := cfg.Hypervisor
	c := vmm.Config{
		ID: id, StateDir: stateDir, QEMUPath: h.Path, Kernel: h.Kernel, Initrd: h.Initrd, KernelArgs: h.KernelArgs,
		MachineType: h.MachineType, CPUModel: h.CPUModel, Accel: h.Accel,
		VCPUs: rec.VCPUs, MemoryMiB: rec.MemoryMiB, HotplugPorts: rec.HotplugPort,
		MemoryShared: false, Incoming: true, VMGenID: true, MemoryPath: m.RAM,
	}
	if rec.RAMInStream || m.RAM == "" {
		// RAM comes in the device state: map an empty sparse file.
		c.MemoryPath = filepath.Join(stateDir, "ram.empty")
		if err := os.WriteFile(c.MemoryPath, nil, 0o600); err != nil {
			return c, err
		}
		if err := os.Truncate(c.MemoryPath, int64(rec.MemoryMiB)<<20); err != nil {
			return c, err
		}
	}
	for _, d := range rec.Disks {
		base, ok := m.Disks[d.Name]
		if !ok {
			return c, fmt.Errorf("restore: snapshot has no disk %q: %w", d.Name, errdefs.ErrDataLoss)
		}
		dir := filepath.Join(diskDir, d.ID)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return c, err
		}
		overlay := filepath.Join(dir, "restored.qcow2")
		if err := createOverlay(ctx, base, overlay); err != nil {
			return c, fmt.Errorf("restore: overlay for disk %s: %w", d.Name, err)
		}
		c.Disks = append(c.Disks, vmm.Disk{ID: d.ID, Serial: d.Serial, Port: d.Port, Path: overlay, Format: "qcow2", ReadOnly: d.ReadOnly})
	}
	return c, nil
}

// checkHost compares what the snapshot's VM was with what this host would
// run; the error names the first field that differs.
func checkHost(cfg configs.Config, fp snapshot.Fingerprint, g guestDigests) error {
	host := fp
	h := cfg.Hypervisor
	host.MachineType, host.CPUModel, host.Accel = h.MachineType, h.CPUModel, h.Accel
	v, err := newHostFacts(cfg).get(h.Path, "qemu-version", qemuVersion)
	if err != nil {
		return err
	}
	host.QEMUVersion = v
	host.KernelDigest, host.InitrdDigest = g.kernel, g.initrd
	// A guest that used a CPU feature this host lacks would fault (KVM
	// cannot emulate it); Compare names the missing flags.
	host.HostCPUFlags = nil
	if len(fp.HostCPUFlags) > 0 {
		if host.HostCPUFlags, err = hostCPUFlags(); err != nil {
			return fmt.Errorf("host cpu flags: %w", err)
		}
	}
	return fp.Compare(host)
}

// hostCPUFlags is this host's /proc/cpuinfo flags (a variable for tests).
var hostCPUFlags = vmm.HostCPUFlags

var qemuVersionRe = regexp.MustCompile(`version ([0-9]+\.[0-9]+\.[0-9]+)`)

// qemuVersion asks the QEMU binary its version.
func qemuVersion(path string) (string, error) {
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	m := qemuVersionRe.FindStringSubmatch(string(out))
	if m == nil {
		return "", fmt.Errorf("%s --version: no version in %q", path, strings.TrimSpace(string(out)))
	}
	return m[1], nil
}

func newHostFacts(cfg configs.Config) hostFactsCache {
	return hostFactsCache{path: filepath.Join(cfg.Snapshot.CacheDir, "host-facts.json")}
}

// guestDigests are the sha256 digests ("sha256:<hex>") of the guest
// kernel and initrd, from the node's host facts, so that no shim hashes the
// files again: a restore compares them with the snapshot's, and the VM's
// fingerprint, which a checkpoint records inside its pause window, needs
// them.
type guestDigests struct{ kernel, initrd string }

func hostGuestDigests(cfg configs.Config) (guestDigests, error) {
	facts := newHostFacts(cfg)
	var g guestDigests
	var err error
	if g.kernel, err = facts.get(cfg.Hypervisor.Kernel, "sha256", digestFile); err != nil {
		return g, fmt.Errorf("guest kernel: %w", err)
	}
	if g.initrd, err = facts.get(cfg.Hypervisor.Initrd, "sha256", digestFile); err != nil {
		return g, fmt.Errorf("guest initrd: %w", err)
	}
	return g, nil
}

// apply gives the VM config the digests (vmm takes them in hex).
func (g guestDigests) apply(c vmm.Config) vmm.Config {
	c.KernelSHA256 = strings.TrimPrefix(g.kernel, "sha256:")
	c.InitrdSHA256 = strings.TrimPrefix(g.initrd, "sha256:")
	return c
}

// hostFactsCache remembers facts about host files (QEMU's version, the
// guest kernel's digest) across shim processes, keyed by path, size and
// modification time: every restore is a new shim, and hashing the kernel or
// running QEMU costs tens of milliseconds of a restore.
type hostFactsCache struct{ path string }

func (h hostFactsCache) get(file, fact string, compute func(string) (string, error)) (string, error) {
	bin := file
	if !filepath.IsAbs(bin) {
		p, err := exec.LookPath(bin)
		if err != nil {
			return "", err
		}
		bin = p
	}
	st, err := os.Stat(bin)
	if err != nil {
		return "", err
	}
	key := fmt.Sprintf("%s %s %d %d", fact, bin, st.Size(), st.ModTime().UnixNano())
	facts := map[string]string{}
	if b, err := os.ReadFile(h.path); err == nil {
		_ = json.Unmarshal(b, &facts)
	}
	if v, ok := facts[key]; ok {
		return v, nil
	}
	v, err := compute(bin)
	if err != nil {
		return "", err
	}
	facts[key] = v
	if b, err := json.Marshal(facts); err == nil && os.MkdirAll(filepath.Dir(h.path), 0o700) == nil {
		_ = writeFileAtomic(h.path, b, 0o600) // a cache: losing a write costs one recomputation
	}
	return v, nil
}

// checkpointRef is what the task API's Checkpoint leaves in its Path: the
// snapshot's location.
type checkpointRef struct {
	// URL is the store URL with reference; empty when the snapshot is in
	// the checkpoint directory itself (Local).
	URL    string `json:"url,omitempty"`
	Local  string `json:"local,omitempty"` // reference inside <dir>/snapshot
	Digest string `json:"digest"`
}

const checkpointRefFile = "cryo-checkpoint.json"

// readCheckpointRef reads the reference a checkpoint left in containerd's
// checkpoint directory. The directory is containerd's, but its contents
// came from a checkpoint image that anyone may have built: the reference
// is read without following a symlink and decoded strictly
// (decodeCheckpointRef), and the store under it follows no symlink.
func readCheckpointRef(dir string) (restoreSource, error) {
	real, err := filepath.EvalSymlinks(dir) // containerd's own path
	if err != nil {
		return restoreSource{}, fmt.Errorf("containerd checkpoint %s: %w", dir, err)
	}
	d, err := safefs.OpenDir(real)
	if err != nil {
		return restoreSource{}, fmt.Errorf("containerd checkpoint %s: %w", dir, err)
	}
	defer d.Close()
	b, err := d.ReadFile(checkpointRefFile, maxCheckpointRef)
	if err != nil {
		return restoreSource{}, fmt.Errorf("containerd checkpoint %s is not a cryo checkpoint: %w", dir, err)
	}
	return decodeCheckpointRef(b, real)
}

func digestFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	d, err := digest.SHA256.FromReader(f)
	if err != nil {
		return "", err
	}
	return d.String(), nil
}
