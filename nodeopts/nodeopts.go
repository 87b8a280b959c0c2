// Package nodeopts maps the node's configuration (configs.Config, the
// TOML) onto what a sandbox takes of its node (sandbox.Node), once per
// shim: the sandbox knows nothing of the file's layout, as Kata's
// katautils maps its TOML onto virtcontainers' own types.
package nodeopts

import (
	"fmt"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/sandbox"
	"github.com/cryo-runtime/cryo/vmm"
)

// Sandbox maps cfg onto a sandbox's node options and opens the node cache
// it names.
func Sandbox(cfg configs.Config) (sandbox.Node, error) {
	cache, err := cfg.Snapshot.NodeCache()
	if err != nil {
		return sandbox.Node{}, fmt.Errorf("node cache: %w", err)
	}
	n := Template(cfg)
	n.Cache = cache
	return n, nil
}

// Template is Sandbox without the node cache (nil): what needs it fails,
// as with a cache that cannot be opened.
func Template(cfg configs.Config) sandbox.Node {
	h, r := cfg.Hypervisor, cfg.Restore
	return sandbox.Node{
		VM: sandbox.VMTemplate{
			QEMUPath: h.Path, Kernel: h.Kernel, Initrd: h.Initrd, KernelArgs: h.KernelArgs,
			MachineType: h.MachineType, CPUModel: h.CPUModel, Accel: h.Accel,
			HotplugPorts: h.HotplugPorts, MemoryDir: h.MemoryDir,
			ServedRAM:    cfg.Memory.Booted == configs.BootedServed,
			SharedClones: cfg.Memory.Clones == configs.ClonesShared,
			Confine: vmm.Confinement{
				Disabled: !h.ConfineQEMU,
				UIDBase:  h.QEMUUIDBase, UIDCount: h.QEMUUIDCount,
				// LockDir stays vmm's host-wide default, whatever
				// state_root says: two installations on one host must
				// not hand out the same uid.
			},
			ConsoleMaxBytes: int64(h.ConsoleLogKiB) << 10,
		},
		Limits: sandbox.Limits{
			MaxVCPUs: h.MaxVCPUs, MaxMemoryMiB: h.MaxMemoryMiB,
			MaxDiskSize: r.MaxDiskSizeMiB << 20, MaxDeviceState: r.MaxDeviceStateMiB << 20,
		},
		WorkDir:     cfg.Snapshot.CacheDir,
		Stores:      cfg.Stores,
		Keys:        cfg.Snapshot,
		Agent:       sandbox.AgentTimeouts{Dial: cfg.Agent.DialTimeout.Duration, Request: cfg.Agent.RequestTimeout.Duration},
		RootFS:      sandbox.RootFSOptions{ImageCache: cfg.Runtime.ImageCache, WritableDiskMiB: cfg.Runtime.WritableDiskMiB},
		Lazy:        sandbox.LazyOptions{PrefetchWorkers: r.PrefetchWorkers, PageTimeout: r.PageTimeout.Duration},
		RuntimeType: configs.RuntimeType,
	}
}
