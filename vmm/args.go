package vmm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The PCI layout of the root bus (pcie.0). Every device gets an explicit
// address so that a restore, which must present the same hardware, builds
// the same machine whatever the order of the command line. On q35 with
// -nodefaults, slot 0 is the host bridge and slot 0x1f the LPC/SATA/SMBus
// functions; slots 0x02-0x1e are ours.
const (
	slotVirtioSerial = 0x02
	slotFirstNIC     = 0x03 // NICs: 0x03-0x05
	slotFirstDisk    = 0x06 // disks on the root bus: 0x06-0x0f
	slotFirstPort    = 0x10 // pcie-root-ports: 0x10-0x1e

	MaxNICs         = slotFirstDisk - slotFirstNIC
	MaxBootDisks    = slotFirstPort - slotFirstDisk
	MaxHotplugPorts = 0x1f - slotFirstPort
)

// Device is one guest-visible device with its place on the PCI topology.
// Bus is "pcie.0" or a root port id ("rp3"); Addr is the slot ("0x6").
type Device struct {
	ID     string `json:"id"`
	Driver string `json:"driver"`
	Bus    string `json:"bus,omitempty"`
	Addr   string `json:"addr,omitempty"`
}

// portID names hot-plug root port i.
func portID(i int) string { return "rp" + strconv.Itoa(i) }

// portIndex parses a root port id; -1 if it is not one.
func portIndex(id string) int {
	if !portRe.MatchString(id) {
		return -1
	}
	i, _ := strconv.Atoi(strings.TrimPrefix(id, "rp"))
	return i
}

// nodeName is the block node of a disk as added at boot or hot-plug.
// (Node names are limited to 31 characters; ids to 24.)
func nodeName(diskID string) string { return "n" + diskID }

func hexSlot(s int) string { return fmt.Sprintf("0x%x", s) }

// diskDevice places disk d: on its root port, or in root-bus slot index i.
func diskDevice(d Disk, i int) Device {
	if d.Port != "" {
		return Device{ID: d.ID, Driver: "virtio-blk-pci", Bus: d.Port, Addr: "0x0"}
	}
	return Device{ID: d.ID, Driver: "virtio-blk-pci", Bus: "pcie.0", Addr: hexSlot(slotFirstDisk + i)}
}

// layout returns the devices of cfg (defaulted and valid) in command-line
// order: root ports come before the disks that sit on them.
func layout(cfg Config, disks []Disk) []Device {
	devs := []Device{
		{ID: "vser0", Driver: "virtio-serial-pci", Bus: "pcie.0", Addr: hexSlot(slotVirtioSerial)},
		{ID: "agent0", Driver: "virtserialport", Bus: "vser0.0", Addr: "1"},
	}
	for i := 0; i < cfg.HotplugPorts; i++ {
		devs = append(devs, Device{ID: portID(i), Driver: "pcie-root-port", Bus: "pcie.0", Addr: hexSlot(slotFirstPort + i)})
	}
	for i, n := range cfg.NICs {
		devs = append(devs, Device{ID: n.ID, Driver: "virtio-net-pci", Bus: "pcie.0", Addr: hexSlot(slotFirstNIC + i)})
	}
	root := 0
	for _, d := range disks {
		devs = append(devs, diskDevice(d, root))
		if d.Port == "" {
			root++
		}
	}
	if cfg.VMGenID {
		devs = append(devs, Device{ID: "vmgenid0", Driver: "vmgenid"})
	}
	return devs
}

// optEscape escapes a value for QEMU's key=value,... option syntax.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// jsonArg renders a -blockdev/-object argument in QEMU's JSON syntax, which
// needs no escaping of paths.
func jsonArg(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of strings, bools and numbers always marshal
	}
	return string(b)
}

// diskDeviceArgs is the device_add argument for disk d at dev.
func diskDeviceArgs(d Disk, dev Device, node string) map[string]any {
	a := map[string]any{"driver": dev.Driver, "id": d.ID, "drive": node, "bus": dev.Bus, "addr": dev.Addr}
	if d.Serial != "" {
		a["serial"] = d.Serial
	}
	return a
}

// kernelCmdline is the full -append value.
func kernelCmdline(cfg Config) string {
	return strings.TrimSpace(DefaultKernelArgs + " " + cfg.KernelArgs)
}

// fdKind says what a descriptor passed to QEMU is.
type fdKind int

const (
	fdFile       fdKind = iota // a file opened with passedFile's path and flag
	fdQMP                      // the QMP socket, listening
	fdAgent                    // the agent port's socket, listening
	fdConsole                  // the write end of the console pipe
	fdRAM                      // the guest RAM file, read-write
	fdKernelStub               // a restore's stand-in for the kernel at path (kernelstub.go)
)

// fdSlot is one descriptor QEMU gets at exec, after the taps.
type fdSlot struct {
	kind fdKind
	passedFile
}

// bootFDs is what buildArgs derives besides the argv: the descriptors to
// pass (fd 3+len(NICs)+i is slots[i]) and each disk's fd sets.
type bootFDs struct {
	slots    []fdSlot
	diskSets [][]int // per cfg.Disks entry, one set per image of its chain
	lastSet  int
}

// buildArgs returns QEMU's argv (without argv[0]) for a defaulted, valid
// cfg whose disks have the backing chains chains. NIC i's tap is expected as
// file descriptor 3+i (exec.Cmd.ExtraFiles), then the descriptors of
// bootFDs.slots: QEMU opens nothing by a path of the host's (see
// Confinement).
func buildArgs(cfg Config, chains []*image) ([]string, bootFDs) {
	var fds bootFDs
	slot := func(s fdSlot) int {
		fds.slots = append(fds.slots, s)
		return 3 + len(cfg.NICs) + len(fds.slots) - 1
	}
	nextSet := func() int { fds.lastSet++; return fds.lastSet }
	// The opaque string is only a label (query-fdsets shows it); it also
	// keeps the sandbox's state dir in QEMU's command line, by which tools
	// find the QEMUs of a state root.
	addFD := func(fd, set int, label string) []string {
		return []string{"-add-fd", fmt.Sprintf("fd=%d,set=%d,opaque=%s", fd, set, optEscape(label))}
	}

	qmpFD, agentFD := slot(fdSlot{kind: fdQMP}), slot(fdSlot{kind: fdAgent})
	consoleSet := nextSet()
	consoleFD := slot(fdSlot{kind: fdConsole, passedFile: passedFile{set: consoleSet}})
	ramFD := slot(fdSlot{kind: fdRAM})
	kernel := fdSlot{passedFile: passedFile{path: cfg.Kernel, flag: os.O_RDONLY}}
	if cfg.Memory.Incoming {
		kernel.kind = fdKernelStub
	}
	kernelFD := slot(kernel)
	a := []string{
		"-name", "guest=" + cfg.ID + ",debug-threads=on",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
	}
	if !cfg.Confine.Disabled {
		a = append(a, "-sandbox", SandboxOptions)
	}
	a = append(a,
		"-machine", cfg.MachineType+",memory-backend=ram0",
		"-accel", cfg.Accel,
		"-cpu", cpuArg(cfg),
		"-smp", strconv.Itoa(cfg.VCPUs),
		"-m", strconv.Itoa(cfg.MemoryMiB)+"M",
		"-object", jsonArg(cfg.Memory.backend(cfg.MemoryMiB, procFD(ramFD))),
		"-kernel", procFD(kernelFD),
	)
	if cfg.Initrd != "" && !cfg.Memory.Incoming {
		fd := slot(fdSlot{passedFile: passedFile{path: cfg.Initrd, flag: os.O_RDONLY}})
		a = append(a, "-initrd", procFD(fd))
	}
	a = append(a, "-append", kernelCmdline(cfg))
	a = append(a, addFD(consoleFD, consoleSet, filepath.Join(cfg.StateDir, ConsoleLogName))...)
	a = append(a,
		// append=on: QEMU would truncate the pipe (ftruncate) otherwise.
		"-chardev", "file,id=serial0,append=on,path="+fdsetPath(consoleSet),
		"-serial", "chardev:serial0",
		"-chardev", fmt.Sprintf("socket,id=qmp,fd=%d,server=on,wait=off", qmpFD),
		"-mon", "chardev=qmp,mode=control",
		"-chardev", fmt.Sprintf("socket,id=agent,fd=%d,server=on,wait=off", agentFD),
	)
	for i, n := range cfg.NICs {
		a = append(a, "-netdev", fmt.Sprintf("tap,id=net-%s,fd=%d", n.ID, 3+i))
	}
	for i, d := range cfg.Disks {
		sets, files := chainFiles(chains[i], d.ReadOnly, nextSet)
		for _, f := range files {
			a = append(a, addFD(slot(fdSlot{passedFile: f}), f.set, f.path)...)
		}
		fds.diskSets = append(fds.diskSets, sets)
		a = append(a, "-blockdev", jsonArg(chainNode(chains[i], sets, nodeName(d.ID), d.ReadOnly)))
	}
	di := 0 // layout lists the disks in cfg.Disks order
	for _, dev := range layout(cfg, cfg.Disks) {
		var opts string
		switch dev.Driver {
		case "virtio-serial-pci":
			opts = fmt.Sprintf("virtio-serial-pci,id=%s,bus=%s,addr=%s", dev.ID, dev.Bus, dev.Addr)
		case "virtserialport":
			opts = fmt.Sprintf("virtserialport,id=%s,bus=%s,nr=%s,chardev=agent,name=%s", dev.ID, dev.Bus, dev.Addr, AgentPortName)
		case "pcie-root-port":
			i := portIndex(dev.ID)
			opts = fmt.Sprintf("pcie-root-port,id=%s,bus=%s,addr=%s,chassis=%d", dev.ID, dev.Bus, dev.Addr, i+1)
		case "virtio-net-pci":
			n := cfg.NICs[dev.slot()-slotFirstNIC]
			opts = fmt.Sprintf("virtio-net-pci,id=%s,netdev=net-%s,mac=%s,bus=%s,addr=%s", n.ID, n.ID, n.MAC, dev.Bus, dev.Addr)
		case "virtio-blk-pci":
			d := cfg.Disks[di]
			di++
			opts = fmt.Sprintf("virtio-blk-pci,id=%s,drive=%s,bus=%s,addr=%s", d.ID, nodeName(d.ID), dev.Bus, dev.Addr)
			if d.Serial != "" {
				opts += ",serial=" + d.Serial
			}
		case "vmgenid":
			opts = "vmgenid,id=" + dev.ID + ",guid=auto"
		}
		a = append(a, "-device", opts)
	}
	a = append(a, cfg.Memory.startArgs()...)
	return a, fds
}

// slot parses a root-bus address such as "0x6".
func (d Device) slot() int {
	n, err := strconv.ParseInt(strings.TrimPrefix(d.Addr, "0x"), 16, 32)
	if err != nil {
		return -1
	}
	return int(n)
}

// cpuArg is the -cpu value. Under KVM a named model gets enforce: QEMU then
// refuses to start on a host that lacks one of the model's features instead
// of silently hiding it from a guest (whose restored kernel uses it).
func cpuArg(cfg Config) string {
	if cfg.Accel == "kvm" && cfg.CPUModel != "host" && cfg.CPUModel != "max" {
		return cfg.CPUModel + ",enforce"
	}
	return cfg.CPUModel
}
