package vmm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"github.com/cryo-runtime/cryo/fingerprint"
)

// digests are the guest files' digests (hex), from the config or computed
// once.
type digests struct{ kernel, initrd string }

// Fingerprint describes the machine as it is now (devices include
// hot-plugged disks): the QEMU version from query-version once started,
// before that Config.QEMUVersion; the host CPU flags its CPU model uses,
// under KVM, once started. The kernel and initrd digests come from the
// config or are computed once.
func (m *Machine) Fingerprint() fingerprint.Fingerprint {
	m.fpOnce.Do(func() {
		m.fp.kernel, m.fp.initrd = m.cfg.KernelSHA256, m.cfg.InitrdSHA256
		if m.fp.kernel == "" {
			m.fp.kernel = fileSHA256(m.cfg.Kernel)
		}
		if m.fp.initrd == "" && m.cfg.Initrd != "" {
			m.fp.initrd = fileSHA256(m.cfg.Initrd)
		}
	})
	m.mu.Lock()
	version, flags := m.version, m.cpuFlags
	m.mu.Unlock()
	if version == "" {
		version = m.cfg.QEMUVersion
	}
	f := fingerprint.Fingerprint{
		QEMUVersion:  version,
		MachineType:  m.cfg.MachineType,
		CPUModel:     m.cfg.CPUModel,
		Accel:        m.cfg.Accel,
		MemoryMiB:    int64(m.cfg.MemoryMiB),
		VCPUs:        m.cfg.VCPUs,
		HostCPUFlags: flags,
	}
	if m.fp.kernel != "" {
		f.KernelDigest = "sha256:" + m.fp.kernel
	}
	if m.fp.initrd != "" {
		f.InitrdDigest = "sha256:" + m.fp.initrd
	}
	for _, d := range m.Devices() {
		f.Devices = append(f.Devices, fingerprint.Device{ID: d.ID, Driver: d.Driver, PCIAddr: d.Bus + "/" + d.Addr})
	}
	return f
}

// CheckRestore reports whether device state saved by a machine with
// fingerprint saved can be loaded into this one, before Start
// (fingerprint.Check; the error wraps errdefs.ErrFailedPrecondition). This
// host's side is the machine's Fingerprint with this host's CPU flags
// (/proc/cpuinfo) when saved needs any, and Config.QEMUVersion or, unset,
// QEMUPath's --version.
func (m *Machine) CheckRestore(saved fingerprint.Fingerprint) error {
	return checkOnHost(m.cfg, saved, m.Fingerprint())
}

// CheckHost is CheckRestore before there is a machine: it checks what the
// host decides (QEMU version, machine type, CPU model, accel, guest kernel
// and initrd digests, CPU flags) against saved, so that a restore refuses
// before it downloads the snapshot. The VM's shape (memory, vCPUs,
// devices) is taken from saved here: CheckRestore compares it once the
// machine is built from the snapshot. cfg needs only the host's fields.
func CheckHost(cfg Config, saved fingerprint.Fingerprint) error {
	cfg = cfg.withDefaults()
	host := saved
	host.MachineType, host.CPUModel, host.Accel = cfg.MachineType, cfg.CPUModel, cfg.Accel
	host.QEMUVersion = cfg.QEMUVersion
	host.KernelDigest, host.InitrdDigest = fileDigest(cfg.KernelSHA256, cfg.Kernel), ""
	if cfg.Initrd != "" {
		host.InitrdDigest = fileDigest(cfg.InitrdSHA256, cfg.Initrd)
	}
	return checkOnHost(cfg, saved, host)
}

// checkOnHost completes host with what only this host knows (QEMU's
// version if the config has none, the host's CPU flags) and checks saved
// against it.
func checkOnHost(cfg Config, saved, host fingerprint.Fingerprint) error {
	if host.QEMUVersion == "" {
		v, err := fingerprint.QEMUVersion(cfg.QEMUPath)
		if err != nil {
			return err
		}
		host.QEMUVersion = v
	}
	// A guest that used a CPU feature this host lacks would fault (KVM
	// cannot emulate it): the host needs every flag saved lists.
	host.HostCPUFlags = nil
	if len(saved.HostCPUFlags) > 0 {
		flags, err := HostCPUFlags()
		if err != nil {
			return fmt.Errorf("host cpu flags: %w", err)
		}
		host.HostCPUFlags = flags
	}
	return saved.Check(host)
}

// fileDigest is "sha256:<known>", else the file's digest ("" if unreadable).
func fileDigest(known, path string) string {
	if known == "" {
		known = fileSHA256(path)
	}
	if known == "" {
		return ""
	}
	return "sha256:" + known
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
