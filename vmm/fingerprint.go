package vmm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/containerd/errdefs"
)

// Fingerprint is what a saved device state depends on. QEMU refuses some
// mismatches only with a message on stderr (machine type, RAM size) and
// silently accepts others (CPU model, an extra device), so a snapshot
// records it and a restore compares it before starting QEMU.
type Fingerprint struct {
	QEMUVersion  string   `json:"qemuVersion"` // from query-version, e.g. "7.2.19"; empty before Start
	MachineType  string   `json:"machineType"`
	CPUModel     string   `json:"cpuModel"`
	Accel        string   `json:"accel"`
	MemoryMiB    int      `json:"memoryMiB"`
	VCPUs        int      `json:"vcpus"`
	Devices      []Device `json:"devices"`
	KernelArgs   string   `json:"kernelArgs"`
	KernelSHA256 string   `json:"kernelSHA256"`
	InitrdSHA256 string   `json:"initrdSHA256,omitempty"`
	// HostCPUFlags are the host CPU flags (/proc/cpuinfo names) the CPU
	// model uses, under KVM; a restore needs a host that has them all.
	HostCPUFlags []string `json:"hostCPUFlags,omitempty"`
}

// Fingerprint describes the machine as it is now (devices include
// hot-plugged disks). The kernel and initrd digests come from the config or
// are computed once.
func (m *Machine) Fingerprint() Fingerprint {
	m.fpOnce.Do(func() {
		m.fp.KernelSHA256, m.fp.InitrdSHA256 = m.cfg.KernelSHA256, m.cfg.InitrdSHA256
		if m.fp.KernelSHA256 == "" {
			m.fp.KernelSHA256 = fileSHA256(m.cfg.Kernel)
		}
		if m.fp.InitrdSHA256 == "" && m.cfg.Initrd != "" {
			m.fp.InitrdSHA256 = fileSHA256(m.cfg.Initrd)
		}
	})
	m.mu.Lock()
	version, flags := m.version, m.cpuFlags
	m.mu.Unlock()
	return Fingerprint{
		QEMUVersion:  version,
		MachineType:  m.cfg.MachineType,
		CPUModel:     m.cfg.CPUModel,
		Accel:        m.cfg.Accel,
		MemoryMiB:    m.cfg.MemoryMiB,
		VCPUs:        m.cfg.VCPUs,
		Devices:      m.Devices(),
		KernelArgs:   kernelCmdline(m.cfg),
		KernelSHA256: m.fp.KernelSHA256,
		InitrdSHA256: m.fp.InitrdSHA256,
		HostCPUFlags: flags,
	}
}

// CheckRestore reports whether device state saved by a machine with
// fingerprint saved can be loaded into a machine with fingerprint f. The
// error (wrapping errdefs.ErrFailedPrecondition) names every difference.
// QEMU versions must agree on major.minor (empty versions are not compared);
// the guest kernel and its arguments are not compared: the running kernel
// lives in the saved RAM.
func (f Fingerprint) CheckRestore(saved Fingerprint) error {
	var diffs []string
	diff := func(what string, have, want any) {
		if fmt.Sprint(have) != fmt.Sprint(want) {
			diffs = append(diffs, fmt.Sprintf("%s: snapshot %v, here %v", what, want, have))
		}
	}
	if f.QEMUVersion != "" && saved.QEMUVersion != "" {
		diff("qemu version", majorMinor(f.QEMUVersion), majorMinor(saved.QEMUVersion))
	}
	diff("machine type", f.MachineType, saved.MachineType)
	diff("cpu model", f.CPUModel, saved.CPUModel)
	diff("accel", f.Accel, saved.Accel)
	diff("memory MiB", f.MemoryMiB, saved.MemoryMiB)
	diff("vcpus", f.VCPUs, saved.VCPUs)
	have := map[string]Device{}
	for _, d := range f.Devices {
		have[d.ID] = d
	}
	for _, d := range saved.Devices {
		h, ok := have[d.ID]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("device %s (%s at %s/%s): missing here", d.ID, d.Driver, d.Bus, d.Addr))
			continue
		}
		delete(have, d.ID)
		diff("device "+d.ID, h, d)
	}
	for _, d := range f.Devices {
		if _, extra := have[d.ID]; extra {
			diffs = append(diffs, fmt.Sprintf("device %s (%s at %s/%s): not in snapshot", d.ID, d.Driver, d.Bus, d.Addr))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%w: vm fingerprint mismatch: %s", errdefs.ErrFailedPrecondition, strings.Join(diffs, "; "))
	}
	return nil
}

func majorMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}

func fileSHA256(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}
