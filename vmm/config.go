package vmm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
)

// Defaults applied by New to zero fields.
const (
	DefaultQEMUPath     = "qemu-system-x86_64"
	DefaultMachineType  = "pc-q35-7.2"
	DefaultHotplugPorts = 8
	// DefaultKernelArgs come before Config.KernelArgs on the kernel command line.
	DefaultKernelArgs = "console=ttyS0 panic=-1 reboot=k quiet"
	// AgentPortName is the virtio-serial port name the guest agent opens.
	AgentPortName = "agent.0"
	// MinMemoryMiB is the smallest guest accepted.
	MinMemoryMiB = 64

	minConsoleMaxBytes = 4096
)

// Files in Config.StateDir.
const (
	QMPSocketName   = "qmp.sock"
	AgentSocketName = "agent.sock"
	ConsoleLogName  = "console.log"
	QEMULogName     = "qemu.log" // QEMU's stdout and stderr
	PidFileName     = "qemu.pid"
	metaFileName    = "vmm.json" // what Cleanup needs beyond the pid
)

// Config describes one VM. Everything that affects the guest-visible hardware
// is explicit here, so a restore can rebuild the same machine.
type Config struct {
	ID         string // sandbox id; becomes QEMU's -name
	StateDir   string // per-sandbox dir: qmp.sock, agent.sock, console.log, qemu.log, qemu.pid
	QEMUPath   string // default "qemu-system-x86_64"
	Kernel     string
	Initrd     string
	KernelArgs string // appended after DefaultKernelArgs
	// KernelSHA256 and InitrdSHA256 (hex) are the files' digests when the
	// caller already knows them; Fingerprint hashes the files otherwise.
	KernelSHA256, InitrdSHA256 string
	// QEMUVersion is QEMUPath's version ("7.2.19") when the caller already
	// knows it (host facts): Fingerprint reports it before Start, which
	// CheckRestore needs.
	QEMUVersion string

	MachineType string // versioned, e.g. "pc-q35-7.2"; unversioned aliases ("q35") are refused
	CPUModel    string // named model; default "qemu64" for tcg, "host" for kvm
	Accel       string // "tcg" | "kvm"
	VCPUs       int    // default 1
	MemoryMiB   int

	// Memory is the guest RAM: its file and how it is mapped, which also
	// says whether the VM boots or is restored (MemoryMode).
	Memory Memory

	Disks []Disk // attached at boot, in this order (the order fixes their PCI slots)
	NICs  []NIC  // at most MaxNICs

	// HotplugPorts is the number of pcie-root-port devices created for disk
	// hot-plug: 0 means DefaultHotplugPorts, a negative value means none.
	HotplugPorts int
	VMGenID      bool // -device vmgenid,guid=auto

	// Confine says how QEMU is confined; the zero value confines it.
	Confine Confinement
	// PrivateMemoryDir (tmpfs, default /dev/shm) holds a confined restore's
	// own copy of Memory.Path: QEMU 7.2 opens a memory-backend-file
	// read-write even for share=off, and a materialized RAM file is shared
	// by every restore of its snapshot, so it must not be writable by any
	// QEMU.
	PrivateMemoryDir string
	// ConsoleMaxBytes caps console.log (default DefaultConsoleMaxBytes).
	ConsoleMaxBytes int64
	// AdmitUID, if set, is called with QEMU's uid once it is leased,
	// before QEMU starts: a lazy restore's pagefs admits it (and root)
	// only.
	AdmitUID func(uid int) `json:"-"`
}

// Disk is a virtio-blk disk.
type Disk struct {
	ID       string // QEMU device id; letters, digits, '-' and '_', at most 24, starting with a letter
	Path     string
	Format   string // "raw" | "qcow2"
	ReadOnly bool
	Serial   string // seen by the guest in /sys/block/vdX/serial; at most 20 chars

	// Port places the disk on a hot-plug root port ("rp0", "rp1", ...)
	// instead of a slot on the root bus. HotplugDisk sets it; a restore passes
	// the disks that were hot-plugged at checkpoint time in Config.Disks with
	// the same Port, so the restored machine has the same layout.
	Port string
}

// NIC is a virtio-net device backed by a tap file descriptor.
type NIC struct {
	ID  string   // QEMU device id, same rules as Disk.ID
	Tap *os.File // opened tap (IFF_TAP|IFF_NO_PI|IFF_VNET_HDR); passed to QEMU, the caller keeps it
	MAC string   // e.g. "52:54:00:12:34:56"
}

var (
	idRe      = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,23}$`)
	serialRe  = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,20}$`)
	machineRe = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*-\d+\.\d+$`) // pc-q35-7.2, pc-i440fx-7.2
	cpuRe     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	portRe    = regexp.MustCompile(`^rp([0-9]|1[0-4])$`)
)

// maxSocketPath is the longest unix socket path (sun_path is 108 bytes with a NUL).
const maxSocketPath = 107

// withDefaults returns cfg with zero fields defaulted.
func (cfg Config) withDefaults() Config {
	if cfg.QEMUPath == "" {
		cfg.QEMUPath = DefaultQEMUPath
	}
	if cfg.MachineType == "" {
		cfg.MachineType = DefaultMachineType
	}
	if cfg.Accel == "" {
		cfg.Accel = "tcg"
	}
	if cfg.CPUModel == "" {
		cfg.CPUModel = "qemu64"
		if cfg.Accel == "kvm" {
			cfg.CPUModel = "host"
		}
	}
	if cfg.VCPUs == 0 {
		cfg.VCPUs = 1
	}
	switch {
	case cfg.HotplugPorts == 0:
		cfg.HotplugPorts = DefaultHotplugPorts
	case cfg.HotplugPorts < 0:
		cfg.HotplugPorts = 0
	}
	for i := range cfg.Disks {
		if cfg.Disks[i].Format == "" {
			cfg.Disks[i].Format = "raw"
		}
	}
	cfg.Disks = append([]Disk(nil), cfg.Disks...)
	cfg.NICs = append([]NIC(nil), cfg.NICs...)
	if !cfg.Confine.Disabled {
		cfg.Confine = cfg.Confine.withDefaults()
	}
	if cfg.PrivateMemoryDir == "" {
		cfg.PrivateMemoryDir = "/dev/shm"
	}
	if cfg.ConsoleMaxBytes == 0 {
		cfg.ConsoleMaxBytes = DefaultConsoleMaxBytes
	}
	return cfg
}

// validate reports the first problem of a defaulted config, wrapping
// errdefs.ErrInvalidArgument.
func (cfg Config) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: vm config: %s", errdefs.ErrInvalidArgument, fmt.Sprintf(format, a...))
	}
	if cfg.ID == "" {
		return bad("id is empty")
	}
	if strings.ContainsAny(cfg.ID, ",= \n\t/") {
		return bad("id %q contains one of ',= /' or whitespace", cfg.ID)
	}
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return bad("state dir %q is not an absolute path", cfg.StateDir)
	}
	if n := len(filepath.Join(cfg.StateDir, AgentSocketName)); n > maxSocketPath {
		return bad("state dir %q is too long for unix sockets (%d > %d bytes with %q)", cfg.StateDir, n, maxSocketPath, AgentSocketName)
	}
	for _, f := range []struct{ what, path string }{{"kernel", cfg.Kernel}, {"initrd", cfg.Initrd}} {
		if f.path == "" {
			if f.what == "initrd" {
				continue // a kernel alone can boot
			}
			return bad("no kernel")
		}
		st, err := os.Stat(f.path)
		if err != nil {
			return bad("%s: %v", f.what, err)
		}
		if !st.Mode().IsRegular() {
			return bad("%s %s is not a regular file", f.what, f.path)
		}
	}
	if !machineRe.MatchString(cfg.MachineType) {
		return bad("machine type %q is not versioned (want e.g. %q): an alias may change meaning between QEMU versions and break restores", cfg.MachineType, DefaultMachineType)
	}
	if !strings.HasPrefix(cfg.MachineType, "pc-q35-") {
		return bad("machine type %q: only pc-q35-* is supported (PCIe root ports for hot-plug)", cfg.MachineType)
	}
	if cfg.Accel != "tcg" && cfg.Accel != "kvm" {
		return bad("accel %q: want tcg or kvm", cfg.Accel)
	}
	if !cpuRe.MatchString(cfg.CPUModel) {
		return bad("cpu model %q: want a named model such as qemu64 or host", cfg.CPUModel)
	}
	if cfg.VCPUs < 1 || cfg.VCPUs > 64 {
		return bad("vcpus %d: want 1..64", cfg.VCPUs)
	}
	if cfg.MemoryMiB < MinMemoryMiB {
		return bad("memory %d MiB: want at least %d", cfg.MemoryMiB, MinMemoryMiB)
	}
	if cfg.Memory.Path == "" || !filepath.IsAbs(cfg.Memory.Path) {
		return bad("memory path %q is not an absolute path", cfg.Memory.Path)
	}
	if err := cfg.Memory.validate(); err != nil {
		return bad("%v", err)
	}
	if err := cfg.Confine.validate(); err != nil {
		return bad("%v", err)
	}
	if !filepath.IsAbs(cfg.PrivateMemoryDir) {
		return bad("private memory dir %q is not an absolute path", cfg.PrivateMemoryDir)
	}
	if cfg.ConsoleMaxBytes < minConsoleMaxBytes {
		return bad("console cap %d bytes: at least %d", cfg.ConsoleMaxBytes, minConsoleMaxBytes)
	}
	if cfg.HotplugPorts > MaxHotplugPorts {
		return bad("hotplug ports %d: at most %d", cfg.HotplugPorts, MaxHotplugPorts)
	}
	if len(cfg.NICs) > MaxNICs {
		return bad("%d nics: at most %d", len(cfg.NICs), MaxNICs)
	}
	ids := map[string]bool{}
	usedPorts := map[string]bool{}
	rootDisks := 0
	for _, d := range cfg.Disks {
		if err := d.validate(); err != nil {
			return bad("%v", err)
		}
		if d.Port == "" {
			rootDisks++
		} else {
			if portIndex(d.Port) >= cfg.HotplugPorts {
				return bad("disk %s: port %s does not exist (%d hotplug ports)", d.ID, d.Port, cfg.HotplugPorts)
			}
			if usedPorts[d.Port] {
				return bad("disk %s: port %s already used", d.ID, d.Port)
			}
			usedPorts[d.Port] = true
		}
		if ids[d.ID] {
			return bad("duplicate device id %q", d.ID)
		}
		ids[d.ID] = true
	}
	if rootDisks > MaxBootDisks {
		return bad("%d disks on the root bus: at most %d", rootDisks, MaxBootDisks)
	}
	for _, n := range cfg.NICs {
		if !idRe.MatchString(n.ID) {
			return bad("nic id %q: want %s", n.ID, idRe)
		}
		if ids[n.ID] {
			return bad("duplicate device id %q", n.ID)
		}
		ids[n.ID] = true
		if n.Tap == nil {
			return bad("nic %s: no tap file", n.ID)
		}
		if hw, err := net.ParseMAC(n.MAC); err != nil || len(hw) != 6 {
			return bad("nic %s: mac %q is not a 48-bit MAC", n.ID, n.MAC)
		}
	}
	return nil
}

func (d Disk) validate() error {
	if !idRe.MatchString(d.ID) {
		return fmt.Errorf("disk id %q: want %s", d.ID, idRe)
	}
	if !filepath.IsAbs(d.Path) {
		return fmt.Errorf("disk %s: path %q is not absolute", d.ID, d.Path)
	}
	if _, err := os.Stat(d.Path); err != nil {
		return fmt.Errorf("disk %s: %v", d.ID, err)
	}
	if d.Format != "raw" && d.Format != "qcow2" {
		return fmt.Errorf("disk %s: format %q: want raw or qcow2", d.ID, d.Format)
	}
	if d.Serial != "" && !serialRe.MatchString(d.Serial) {
		return fmt.Errorf("disk %s: serial %q: want %s", d.ID, d.Serial, serialRe)
	}
	if d.Port != "" && !portRe.MatchString(d.Port) {
		return fmt.Errorf("disk %s: port %q: want rp0..rp%d", d.ID, d.Port, MaxHotplugPorts-1)
	}
	return nil
}

// privateMemory reports whether the machine gives QEMU its own copy of
// Memory.Path (a confined private restore), and names it.
func (cfg Config) privateMemory() (string, bool) {
	if cfg.Memory.Mode != MemoryPrivate || cfg.Memory.Sealed || cfg.Confine.Disabled {
		return "", false
	}
	sum := sha256.Sum256([]byte(cfg.StateDir))
	return filepath.Join(cfg.PrivateMemoryDir, "cryo-vm-"+hex.EncodeToString(sum[:8])+".ram"), true
}
