package vmm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"

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
	host := m.Fingerprint()
	if host.QEMUVersion == "" {
		v, err := QEMUVersion(m.cfg.QEMUPath)
		if err != nil {
			return err
		}
		host.QEMUVersion = v
	}
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

var qemuVersionRe = regexp.MustCompile(`version ([0-9]+\.[0-9]+\.[0-9]+)`)

// QEMUVersion asks the QEMU binary at path its version ("7.2.19").
func QEMUVersion(path string) (string, error) {
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
