package snapshot

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// Fingerprint is everything about the VM that a restore must reproduce
// exactly: QEMU refuses a different machine type or RAM size (with a message
// only on stderr) and silently accepts a different CPU model or an extra
// device, so cryo compares the fingerprint itself before starting QEMU.
type Fingerprint struct {
	QEMUVersion string `json:"qemuVersion"`
	// MachineType is the versioned machine type, e.g. "pc-q35-7.2".
	MachineType string `json:"machineType"`
	CPUModel    string `json:"cpuModel"`
	// HostCPUFlags are the host CPU flags the guest needs (sorted or not:
	// compared as a set).
	HostCPUFlags []string `json:"hostCPUFlags,omitempty"`
	MemoryMiB    int64    `json:"memoryMiB"`
	VCPUs        int      `json:"vcpus"`
	Devices      []Device `json:"devices,omitempty"`
	// KernelDigest and InitrdDigest are "sha256:..." of the guest kernel and
	// initrd.
	KernelDigest string `json:"kernelDigest,omitempty"`
	InitrdDigest string `json:"initrdDigest,omitempty"`
	// Accel is "kvm" or "tcg".
	Accel string `json:"accel"`
}

// Device is one guest device with its fixed PCI address.
type Device struct {
	ID      string `json:"id"`
	Driver  string `json:"driver"`
	PCIAddr string `json:"pciAddr,omitempty"`
}

// Compare returns nil when other describes the same VM as f, or an error
// wrapping errdefs.ErrFailedPrecondition that names the first field that
// differs, with both values: "fingerprint: MachineType: snapshot pc-q35-7.2,
// host pc-q35-8.0". f is the snapshot's, other the host's. Host CPU flags are
// a requirement: the host may have more flags than the snapshot needs.
func (f Fingerprint) Compare(other Fingerprint) error {
	diff := func(field string, a, b any) error {
		return fmt.Errorf("fingerprint: %s: snapshot %v, host %v: %w", field, a, b, errdefs.ErrFailedPrecondition)
	}
	switch {
	case f.QEMUVersion != other.QEMUVersion:
		return diff("QEMUVersion", f.QEMUVersion, other.QEMUVersion)
	case f.MachineType != other.MachineType:
		return diff("MachineType", f.MachineType, other.MachineType)
	case f.CPUModel != other.CPUModel:
		return diff("CPUModel", f.CPUModel, other.CPUModel)
	case f.MemoryMiB != other.MemoryMiB:
		return diff("MemoryMiB", f.MemoryMiB, other.MemoryMiB)
	case f.VCPUs != other.VCPUs:
		return diff("VCPUs", f.VCPUs, other.VCPUs)
	case f.KernelDigest != other.KernelDigest:
		return diff("KernelDigest", f.KernelDigest, other.KernelDigest)
	case f.InitrdDigest != other.InitrdDigest:
		return diff("InitrdDigest", f.InitrdDigest, other.InitrdDigest)
	case f.Accel != other.Accel:
		return diff("Accel", f.Accel, other.Accel)
	}
	var missing []string
	for _, fl := range f.HostCPUFlags {
		if !slices.Contains(other.HostCPUFlags, fl) {
			missing = append(missing, fl)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("fingerprint: HostCPUFlags: host lacks %s: %w", strings.Join(missing, ","), errdefs.ErrFailedPrecondition)
	}
	return compareDevices(f.Devices, other.Devices)
}

// compareDevices compares device lists by ID, independent of order.
func compareDevices(snap, host []Device) error {
	byID := make(map[string]Device, len(host))
	for _, d := range host {
		byID[d.ID] = d
	}
	for _, d := range snap {
		h, ok := byID[d.ID]
		if !ok {
			return fmt.Errorf("fingerprint: Devices[%s]: snapshot %s@%s, host has none: %w", d.ID, d.Driver, d.PCIAddr, errdefs.ErrFailedPrecondition)
		}
		if h != d {
			return fmt.Errorf("fingerprint: Devices[%s]: snapshot %s@%s, host %s@%s: %w", d.ID, d.Driver, d.PCIAddr, h.Driver, h.PCIAddr, errdefs.ErrFailedPrecondition)
		}
		delete(byID, d.ID)
	}
	for _, h := range host {
		if _, extra := byID[h.ID]; extra {
			return fmt.Errorf("fingerprint: Devices[%s]: snapshot has none, host %s@%s: %w", h.ID, h.Driver, h.PCIAddr, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}
