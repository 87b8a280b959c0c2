package nodeopts

import (
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/sandbox"
	"github.com/cryo-runtime/cryo/vmm"
)

// TestTemplate: every setting a sandbox reads reaches its node options,
// each from its own key (the values differ, so a swap fails).
func TestTemplate(t *testing.T) {
	cfg := configs.Default()
	h := &cfg.Hypervisor
	h.Path, h.Kernel, h.Initrd, h.KernelArgs = "/q", "/k", "/i", "console=ttyS0"
	h.MachineType, h.CPUModel, h.Accel = "q35", "host", "kvm"
	h.HotplugPorts, h.MemoryDir, h.ConfineQEMU, h.QEMUUIDBase, h.QEMUUIDCount = 3, "/mem", false, 5000, 7
	h.ConsoleLogKiB, h.MaxVCPUs, h.MaxMemoryMiB = 2, 9, 11
	cfg.Restore.MaxDiskSizeMiB, cfg.Restore.MaxDeviceStateMiB = 13, 17
	cfg.Restore.PrefetchWorkers, cfg.Restore.PageTimeout = 19, configs.Duration{Duration: 23 * time.Second}
	cfg.Agent.DialTimeout, cfg.Agent.RequestTimeout = configs.Duration{Duration: 29 * time.Second}, configs.Duration{Duration: 31 * time.Second}
	cfg.Runtime.ImageCache, cfg.Runtime.WritableDiskMiB = "/images", 37
	cfg.Snapshot.CacheDir = "/cache"
	want := sandbox.Node{
		VM: sandbox.VMTemplate{
			QEMUPath: "/q", Kernel: "/k", Initrd: "/i", KernelArgs: "console=ttyS0", MachineType: "q35", CPUModel: "host", Accel: "kvm",
			HotplugPorts: 3, MemoryDir: "/mem", Confine: vmm.Confinement{Disabled: true, UIDBase: 5000, UIDCount: 7}, ConsoleMaxBytes: 2 << 10,
		},
		Limits:      sandbox.Limits{MaxVCPUs: 9, MaxMemoryMiB: 11, MaxDiskSize: 13 << 20, MaxDeviceState: 17 << 20},
		WorkDir:     "/cache",
		Stores:      cfg.Stores,
		Keys:        cfg.Snapshot,
		Agent:       sandbox.AgentTimeouts{Dial: 29 * time.Second, Request: 31 * time.Second},
		RootFS:      sandbox.RootFSOptions{ImageCache: "/images", WritableDiskMiB: 37},
		Lazy:        sandbox.LazyOptions{PrefetchWorkers: 19, PageTimeout: 23 * time.Second},
		RuntimeType: configs.RuntimeType,
	}
	if got := Template(cfg); !reflect.DeepEqual(got, want) {
		t.Fatalf("Template =\n%+v\nwant\n%+v", got, want)
	}
}

// TestQEMUUIDLocksHostWide: two installations with their own state roots
// lease QEMU uids through one lock directory, so they never hand out the
// same uid twice.
func TestQEMUUIDLocksHostWide(t *testing.T) {
	a, b := configs.Default(), configs.Default()
	a.Runtime.StateRoot, b.Runtime.StateRoot = "/run/cryo-a", "/run/cryo-b"
	da, db := Template(a).VM.Confine.LockDir, Template(b).VM.Confine.LockDir
	if da != db || (da != "" && da != vmm.DefaultUIDLockDir) {
		t.Fatalf("uid lock dirs %q and %q: want both vmm's host-wide %q", da, db, vmm.DefaultUIDLockDir)
	}
}

// TestSandboxOpensCache: the node cache is opened once, at the cache_dir
// the config names.
func TestSandboxOpensCache(t *testing.T) {
	cfg := configs.Default()
	cfg.Snapshot.CacheDir = filepath.Join(t.TempDir(), "cache")
	n, err := Sandbox(cfg)
	if err != nil || n.Cache == nil {
		t.Fatalf("Sandbox: cache %v, %v", n.Cache, err)
	}
	cfg.Snapshot.CacheDir = "relative"
	if _, err := Sandbox(cfg); err == nil {
		t.Fatal("a relative cache dir was opened")
	}
}
