package sandbox

import (
	"testing"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/vmm"
)

// testNode is the node options a test's configs.Config maps to, its node
// cache opened: as package nodeopts maps them (which imports sandbox, so
// its tests check the mapping itself).
func testNode(t *testing.T, cfg configs.Config) Node {
	t.Helper()
	h, r := cfg.Hypervisor, cfg.Restore
	n := Node{
		VM: VMTemplate{
			QEMUPath: h.Path, Kernel: h.Kernel, Initrd: h.Initrd, KernelArgs: h.KernelArgs,
			MachineType: h.MachineType, CPUModel: h.CPUModel, Accel: h.Accel,
			HotplugPorts: h.HotplugPorts, MemoryDir: h.MemoryDir, ServedRAM: cfg.Memory.Booted == configs.BootedServed,
			Confine:         vmm.Confinement{Disabled: !h.ConfineQEMU, UIDBase: h.QEMUUIDBase, UIDCount: h.QEMUUIDCount},
			ConsoleMaxBytes: int64(h.ConsoleLogKiB) << 10,
		},
		Limits: Limits{
			MaxVCPUs: h.MaxVCPUs, MaxMemoryMiB: h.MaxMemoryMiB,
			MaxDiskSize: r.MaxDiskSizeMiB << 20, MaxDeviceState: r.MaxDeviceStateMiB << 20,
		},
		WorkDir: cfg.Snapshot.CacheDir, Stores: cfg.Stores, Keys: cfg.Snapshot,
		Agent:       AgentTimeouts{Dial: cfg.Agent.DialTimeout.Duration, Request: cfg.Agent.RequestTimeout.Duration},
		RootFS:      RootFSOptions{ImageCache: cfg.Runtime.ImageCache, WritableDiskMiB: cfg.Runtime.WritableDiskMiB},
		Lazy:        LazyOptions{PrefetchWorkers: r.PrefetchWorkers, PageTimeout: r.PageTimeout.Duration},
		RuntimeType: configs.RuntimeType,
	}
	if cfg.Snapshot.CacheDir != "" {
		c, err := cfg.Snapshot.NodeCache()
		if err != nil {
			t.Fatal(err)
		}
		n.Cache = c
	}
	return n
}
