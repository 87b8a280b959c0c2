package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/vmm"
)

// TestCheckHostRefusesMissingCPUFlag: a KVM snapshot whose CPU model used a
// host feature this host lacks is refused before QEMU starts, naming it.
func TestCheckHostRefusesMissingCPUFlag(t *testing.T) {
	dir := t.TempDir()
	qemu := filepath.Join(dir, "qemu-system-x86_64")
	if err := os.WriteFile(qemu, []byte("#!/bin/sh\necho 'QEMU emulator version 7.2.22 (Debian)'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := configs.Default()
	cfg.Hypervisor.Path, cfg.Hypervisor.Accel, cfg.Hypervisor.CPUModel = qemu, "kvm", "Westmere-v2"
	cfg.Snapshot.CacheDir = filepath.Join(dir, "cache")
	g := guestDigests{kernel: "sha256:aa", initrd: "sha256:bb"}
	fp := snapshot.Fingerprint{
		QEMUVersion: "7.2.22", MachineType: cfg.Hypervisor.MachineType, CPUModel: "Westmere-v2", Accel: "kvm",
		MemoryMiB: 512, VCPUs: 1, KernelDigest: g.kernel, InitrdDigest: g.initrd,
		HostCPUFlags: snapshotFingerprint(vmm.Fingerprint{HostCPUFlags: []string{"pclmulqdq", "sse2"}}).HostCPUFlags,
	}
	old := hostCPUFlags
	t.Cleanup(func() { hostCPUFlags = old })

	hostCPUFlags = func() ([]string, error) { return []string{"fpu", "sse2"}, nil }
	err := checkHost(cfg, fp, g)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "pclmulqdq") || strings.Contains(err.Error(), "sse2") {
		t.Errorf("restore onto a host without pclmulqdq: %v", err)
	}
	hostCPUFlags = func() ([]string, error) { return []string{"fpu", "pclmulqdq", "sse2"}, nil }
	if err := checkHost(cfg, fp, g); err != nil {
		t.Errorf("host with every flag: %v", err)
	}
	fp.HostCPUFlags = nil // TCG snapshots record none
	hostCPUFlags = func() ([]string, error) { t.Error("cpu flags read for a snapshot that needs none"); return nil, nil }
	if err := checkHost(cfg, fp, g); err != nil {
		t.Errorf("snapshot without cpu flags: %v", err)
	}
}
