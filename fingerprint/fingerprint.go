// Package fingerprint describes what a saved VM state depends on, and the
// one rule that decides whether a state saved by one VM loads into another.
//
// vmm produces fingerprints (vmm.Machine.Fingerprint), snapshot stores the
// checkpointed VM's in its metadata (the "fingerprint" field, see
// snapshot/FORMAT.md), and a restore checks it against the VM it built
// (vmm.Machine.CheckRestore) before QEMU starts: QEMU refuses some
// mismatches only with a message on stderr (machine type, RAM size) and
// silently accepts others (CPU model, an extra device). The package is its
// own so that the snapshot format does not import the VMM driver, nor the
// driver the format.
package fingerprint

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// Fingerprint is everything about a VM that a restore must reproduce. The
// JSON field names are the snapshot format's: keep them.
type Fingerprint struct {
	// QEMUVersion is QEMU's version ("7.2.19"): for Check, see
	// checkQEMUVersion.
	QEMUVersion string `json:"qemuVersion"`
	// MachineType is the versioned machine type, e.g. "pc-q35-7.2".
	MachineType string `json:"machineType"`
	CPUModel    string `json:"cpuModel"`
	// HostCPUFlags are, for a saved VM, the host CPU flags (/proc/cpuinfo
	// names) its CPU model uses under KVM; for a host, the flags it has.
	// Compared as sets: the host needs them all.
	HostCPUFlags []string `json:"hostCPUFlags,omitempty"`
	MemoryMiB    int64    `json:"memoryMiB"`
	VCPUs        int      `json:"vcpus"`
	Devices      []Device `json:"devices,omitempty"`
	// KernelDigest and InitrdDigest are "sha256:<hex>" of the guest kernel
	// and initrd.
	KernelDigest string `json:"kernelDigest,omitempty"`
	InitrdDigest string `json:"initrdDigest,omitempty"`
	// Accel is "kvm" or "tcg".
	Accel string `json:"accel"`
}

// Device is one guest device with its fixed PCI address ("<bus>/<addr>").
type Device struct {
	ID      string `json:"id"`
	Driver  string `json:"driver"`
	PCIAddr string `json:"pciAddr,omitempty"`
}

// Check returns nil when device state saved by a VM with fingerprint saved
// loads into a VM with fingerprint host, else an error wrapping
// errdefs.ErrFailedPrecondition that names every field that differs with
// both values: "fingerprint: MachineType: snapshot pc-q35-7.2, host
// pc-q35-8.0". Every field is compared exactly except QEMUVersion
// (checkQEMUVersion), HostCPUFlags (the host may have more) and Devices
// (in any order).
func (saved Fingerprint) Check(host Fingerprint) error {
	var diffs []string
	diff := func(field string, a, b any) {
		if a != b {
			diffs = append(diffs, fmt.Sprintf("%s: snapshot %v, host %v", field, a, b))
		}
	}
	diff("MachineType", saved.MachineType, host.MachineType)
	if err := checkQEMUVersion(saved, host); err != nil {
		diffs = append(diffs, err.Error())
	}
	diff("CPUModel", saved.CPUModel, host.CPUModel)
	diff("Accel", saved.Accel, host.Accel)
	diff("MemoryMiB", saved.MemoryMiB, host.MemoryMiB)
	diff("VCPUs", saved.VCPUs, host.VCPUs)
	diff("KernelDigest", saved.KernelDigest, host.KernelDigest)
	diff("InitrdDigest", saved.InitrdDigest, host.InitrdDigest)
	var missing []string
	for _, fl := range saved.HostCPUFlags {
		if !slices.Contains(host.HostCPUFlags, fl) {
			missing = append(missing, fl)
		}
	}
	if len(missing) > 0 {
		diffs = append(diffs, "HostCPUFlags: host lacks "+strings.Join(missing, ","))
	}
	diffs = append(diffs, compareDevices(saved.Devices, host.Devices)...)
	if len(diffs) > 0 {
		return fmt.Errorf("fingerprint: %s: %w", strings.Join(diffs, "; "), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// machineVersionRE takes the version out of a versioned machine type
// (pc-q35-7.2, pc-i440fx-8.1, virt-9.0).
var machineVersionRE = regexp.MustCompile(`-([0-9]+)\.([0-9]+)$`)

// checkQEMUVersion is the QEMU version rule. QEMU guarantees migration
// between its versions by machine type, not by its own version: a VM of a
// versioned machine type (pc-q35-7.2) migrates from an older QEMU to a newer
// one and back, each keeping the devices as that machine type defined them
// (hw_compat_X_Y; QEMU's docs/devel/migration/compatibility.rst, "older to
// newer" and "newer to older"). So the QEMU versions may differ, as long as
// the machine type is versioned and the host's QEMU knows it (is at least
// the machine type's version; an older one refuses it at start, on stderr
// only). An alias (q35, pc) names the newest machine of each QEMU, a
// different machine in another release: then the versions' major.minor
// must be equal (micro releases add no machine types). The saved version
// stays in the snapshot for diagnosis. An unknown host version ("") fails.
func checkQEMUVersion(saved, host Fingerprint) error {
	hv, ok := majorMinor(host.QEMUVersion)
	if !ok {
		return fmt.Errorf("QEMUVersion: snapshot %s, host %q: not a QEMU version", saved.QEMUVersion, host.QEMUVersion)
	}
	if m := machineVersionRE.FindStringSubmatch(saved.MachineType); m != nil {
		mv := [2]int{atoi(m[1]), atoi(m[2])}
		if hv[0] < mv[0] || hv[0] == mv[0] && hv[1] < mv[1] {
			return fmt.Errorf("QEMUVersion: host %s is older than the snapshot's machine type %s", host.QEMUVersion, saved.MachineType)
		}
		return nil
	}
	if sv, ok := majorMinor(saved.QEMUVersion); !ok || sv != hv {
		return fmt.Errorf("QEMUVersion: snapshot %s, host %s (machine type %s is an alias: it differs between QEMU releases)", saved.QEMUVersion, host.QEMUVersion, saved.MachineType)
	}
	return nil
}

// majorMinor parses "7.2.19" (or "7.2").
func majorMinor(v string) ([2]int, bool) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return [2]int{}, false
	}
	a, err1 := strconv.Atoi(parts[0])
	b, err2 := strconv.Atoi(parts[1])
	return [2]int{a, b}, err1 == nil && err2 == nil
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// compareDevices compares device lists by ID, independent of order.
func compareDevices(saved, host []Device) []string {
	var diffs []string
	byID := make(map[string]Device, len(host))
	for _, d := range host {
		byID[d.ID] = d
	}
	for _, d := range saved {
		h, ok := byID[d.ID]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("Devices[%s]: snapshot %s@%s, host has none", d.ID, d.Driver, d.PCIAddr))
		case h != d:
			diffs = append(diffs, fmt.Sprintf("Devices[%s]: snapshot %s@%s, host %s@%s", d.ID, d.Driver, d.PCIAddr, h.Driver, h.PCIAddr))
		}
		delete(byID, d.ID)
	}
	for _, h := range host {
		if _, extra := byID[h.ID]; extra {
			diffs = append(diffs, fmt.Sprintf("Devices[%s]: snapshot has none, host %s@%s", h.ID, h.Driver, h.PCIAddr))
		}
	}
	return diffs
}
