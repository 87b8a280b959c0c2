package sandbox

import (
	"errors"
	"time"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/vmm"
)

// Node is what a sandbox takes of the node it runs on, mapped once from the
// node's configuration by whoever read it (package nodeopts): the sandbox
// knows nothing of the TOML's layout, as virtcontainers knows nothing of
// Kata's.
type Node struct {
	// VM is the template of every VM of the node.
	VM VMTemplate
	// Limits bound what a snapshot may ask of the node.
	Limits Limits
	// Cache is the node cache, opened once: the verified blobs and
	// materialized snapshots of every restore, the host's facts.
	Cache *nodecache.Node
	// WorkDir holds a checkpoint's files until they are published (on the
	// node cache's file system, so that publishing links them).
	WorkDir string
	// Stores is the store policy: which stores a tenant may name, and how
	// they are opened.
	Stores StorePolicy
	// Keys give each tenant its snapshot read and write options (keys,
	// signature and encryption policy, chunking).
	Keys TenantKeys
	// Agent bounds the guest agent connection.
	Agent AgentTimeouts
	// RootFS is where containers' root disks come from.
	RootFS RootFSOptions
	// Lazy configures a lazy restore's served RAM.
	Lazy LazyOptions
	// RuntimeType names the runtime in a snapshot's source info.
	RuntimeType string
}

// VMTemplate is the host part of every VM: QEMU, the guest image, the
// machine, confinement and the console's cap. A VM's size and devices come
// from its pod (Boot) or its record (Restore).
type VMTemplate struct {
	QEMUPath, Kernel, Initrd, KernelArgs string
	MachineType, CPUModel, Accel         string
	// HotplugPorts are the PCIe root ports a booted VM gets for the root
	// disks of containers created after it.
	HotplugPorts int
	// MemoryDir is the tmpfs directory of the guest RAM files.
	MemoryDir string
	// ServedRAM serves a booted VM's RAM from zeros through pagefs
	// ([memory] booted = "served") instead of an owned tmpfs file.
	ServedRAM bool
	// SharedClones restores every snapshot whose RAM is not in its
	// device state as a shared clone ([memory] clones = "shared"): its
	// QEMU maps the node's base of the snapshot privately (sharedram).
	SharedClones    bool
	Confine         vmm.Confinement
	ConsoleMaxBytes int64
}

// config is a VM of this template with its id and state dir.
func (t VMTemplate) config(id, stateDir string) vmm.Config {
	return vmm.Config{
		ID: id, StateDir: stateDir, QEMUPath: t.QEMUPath, Kernel: t.Kernel, Initrd: t.Initrd, KernelArgs: t.KernelArgs,
		MachineType: t.MachineType, CPUModel: t.CPUModel, Accel: t.Accel, VMGenID: true,
	}
}

// Limits are the node's bounds on what a snapshot describes.
type Limits struct {
	MaxVCPUs, MaxMemoryMiB int
	// MaxDiskSize bounds a snapshot's disk, MaxDeviceState a lazy
	// restore's device state (bytes).
	MaxDiskSize, MaxDeviceState int64
}

// StorePolicy is the node's store policy; configs.Stores is one.
type StorePolicy interface {
	// Allows says whether a sandbox of tenant may name the store URL.
	Allows(url, tenant string) error
	// FetchOptions are the options stores are opened with.
	FetchOptions() stores.Options
	// CachingOptions are the node cache's options for the store at url.
	CachingOptions(url string) nodecache.CachingOptions
}

// TenantKeys give a tenant's snapshot options; configs.Snapshot is one.
// They are asked for when a restore or checkpoint needs them: a key that
// does not load fails that operation, not the sandbox.
type TenantKeys interface {
	ReadOptions(tenant string) (snapshot.ReadOptions, error)
	WriteOptions(tenant string) (snapshot.WriteOptions, error)
}

// AgentTimeouts bound the guest agent connection: the dial of a starting
// guest, and each short request.
type AgentTimeouts struct {
	Dial, Request time.Duration
}

// RootFSOptions are where root disks are built: the shared base images,
// and the least size of a container's writable disk.
type RootFSOptions struct {
	ImageCache      string
	WritableDiskMiB int
}

// LazyOptions configure a lazy restore.
type LazyOptions struct {
	// PrefetchWorkers bound the background fetch (0: none).
	PrefetchWorkers int
	// PageTimeout bounds one page read; a read stuck longer stops the VM.
	PageTimeout time.Duration
}

// Restore modes: how a restore gets the snapshot's RAM (the values of
// configs' restore modes and of the restore-mode annotation).
const (
	RestoreEager = "eager"
	RestoreLazy  = "lazy"
	// RestoreShared is what a restore's log says of a shared clone's
	// RAM (VMTemplate.SharedClones): the node's base, mapped privately.
	RestoreShared = "shared"
)

// errNoNodeCache is what needs the node cache says without one.
var errNoNodeCache = errors.New("no node cache")
