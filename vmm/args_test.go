package vmm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/internal/qcow2"
)

// unitConfig returns a valid config with real (empty) kernel, initrd and
// disk files in a temp dir.
func unitConfig(t *testing.T) Config {
	t.Helper()
	dir := t.TempDir()
	touch := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return Config{
		ID:        "sb1",
		StateDir:  filepath.Join(dir, "state"),
		Kernel:    touch("vmlinuz"),
		Initrd:    touch("initrd"),
		MemoryMiB: 256,
		Memory:    Memory{Mode: MemoryOwned, Path: "/dev/shm/cryo-sb1.ram"},
		Disks: []Disk{
			{ID: "rootfs", Path: touch("root,fs.img"), Format: "raw", ReadOnly: true, Serial: "cryo-rootfs"},
			{ID: "c1", Path: touch("c1.qcow2"), Format: "qcow2", Serial: "c1"},
		},
	}
}

// slotAt returns the passed descriptor a /proc/self/fd/N argument names.
func slotAt(t *testing.T, m *Machine, arg string) fdSlot {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimPrefix(arg, "/proc/self/fd/"))
	i := n - 3 - len(m.cfg.NICs)
	if err != nil || i < 0 || i >= len(m.boot.slots) {
		t.Fatalf("%q is not a passed descriptor", arg)
	}
	return m.boot.slots[i]
}

// setFiles lists the files (path and "rw"/"ro") that -add-fd puts in the
// fd set a /dev/fdset/N path names.
func setFiles(t *testing.T, m *Machine, a []string, fdset string) []string {
	t.Helper()
	var out []string
	for _, v := range argsAfter(a, "-add-fd") {
		var fd, set int
		if _, err := fmt.Sscanf(v, "fd=%d,set=%d", &fd, &set); err != nil {
			t.Fatalf("-add-fd %q: %v", v, err)
		}
		if fdsetPath(set) != fdset {
			continue
		}
		s := slotAt(t, m, procFD(fd))
		if s.kind == fdFile {
			out = append(out, s.path+map[int]string{os.O_RDONLY: " ro", os.O_RDWR: " rw"}[s.flag])
		}
	}
	return out
}

// argAfter returns the values following each occurrence of flag.
func argsAfter(args []string, flag string) []string {
	var out []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			out = append(out, args[i+1])
		}
	}
	return out
}

func mustNew(t *testing.T, cfg Config) *Machine {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

func TestArgsLayoutAndDefaults(t *testing.T) {
	cfg := unitConfig(t)
	cfg.KernelArgs = "cryo.debug=1"
	cfg.VMGenID = true
	tap, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	cfg.NICs = []NIC{{ID: "eth0", Tap: tap, MAC: "52:54:00:12:34:56"}}
	m := mustNew(t, cfg)
	a := m.Args()

	for _, flag := range []string{"-nodefaults", "-no-user-config", "-no-reboot"} {
		if !slices.Contains(a, flag) {
			t.Errorf("missing %s", flag)
		}
	}
	checks := map[string]string{
		"-machine": "pc-q35-7.2,memory-backend=ram0",
		"-accel":   "tcg",
		"-cpu":     "qemu64",
		"-smp":     "1",
		"-m":       "256M",
		"-display": "none",
		"-append":  "console=ttyS0 panic=-1 reboot=k quiet cryo.debug=1",
		"-netdev":  "tap,id=net-eth0,fd=3",
		"-sandbox": SandboxOptions,
	}
	for flag, want := range checks {
		if got := argsAfter(a, flag); len(got) != 1 || got[0] != want {
			t.Errorf("%s = %q, want %q", flag, got, want)
		}
	}
	var mem map[string]any
	if err := json.Unmarshal([]byte(argsAfter(a, "-object")[0]), &mem); err != nil {
		t.Fatal(err)
	}
	if mem["qom-type"] != "memory-backend-file" || mem["share"] != true || mem["size"] != float64(256<<20) || slotAt(t, m, mem["mem-path"].(string)).kind != fdRAM {
		t.Errorf("memory backend = %v", mem)
	}
	if m.ramFile() != cfg.Memory.Path {
		t.Errorf("ram file %s, want %s", m.ramFile(), cfg.Memory.Path)
	}
	for flag, want := range map[string]string{"-kernel": cfg.Kernel, "-initrd": cfg.Initrd} {
		if s := slotAt(t, m, argsAfter(a, flag)[0]); s.kind != fdFile || s.path != want || s.flag != os.O_RDONLY {
			t.Errorf("%s is %+v, want %s read-only", flag, s, want)
		}
	}

	wantDevices := []string{
		"virtio-serial-pci,id=vser0,bus=pcie.0,addr=0x2",
		"virtserialport,id=agent0,bus=vser0.0,nr=1,chardev=agent,name=agent.0",
		"pcie-root-port,id=rp0,bus=pcie.0,addr=0x10,chassis=1",
		"pcie-root-port,id=rp7,bus=pcie.0,addr=0x17,chassis=8",
		"virtio-net-pci,id=eth0,netdev=net-eth0,mac=52:54:00:12:34:56,bus=pcie.0,addr=0x3",
		"virtio-blk-pci,id=rootfs,drive=nrootfs,bus=pcie.0,addr=0x6,serial=cryo-rootfs",
		"virtio-blk-pci,id=c1,drive=nc1,bus=pcie.0,addr=0x7,serial=c1",
		"vmgenid,id=vmgenid0,guid=auto",
	}
	devs := argsAfter(a, "-device")
	for _, w := range wantDevices {
		if !slices.Contains(devs, w) {
			t.Errorf("no -device %s in\n%s", w, strings.Join(devs, "\n"))
		}
	}
	if len(devs) != 2+8+1+2+1 {
		t.Errorf("%d devices, want 14", len(devs))
	}
	for _, d := range devs {
		// virtserialport's address on its bus is its port number, nr=.
		if !strings.Contains(d, "addr=") && !strings.Contains(d, ",nr=") && !strings.HasPrefix(d, "vmgenid") {
			t.Errorf("device without explicit addr: %s", d)
		}
	}
	var bd map[string]any
	bds := argsAfter(a, "-blockdev")
	if len(bds) != 2 {
		t.Fatalf("blockdevs = %q", bds)
	}
	if err := json.Unmarshal([]byte(bds[0]), &bd); err != nil {
		t.Fatal(err)
	}
	file := bd["file"].(map[string]any)
	if bd["node-name"] != "nrootfs" || bd["read-only"] != true || bd["driver"] != "raw" {
		t.Errorf("blockdev = %v", bd)
	}
	if got := setFiles(t, m, a, file["filename"].(string)); !slices.Equal(got, []string{cfg.Disks[0].Path + " ro"}) {
		t.Errorf("rootfs fd set holds %q, want its image read-only (a comma in the path must survive)", got)
	}
	if err := json.Unmarshal([]byte(bds[1]), &bd); err != nil {
		t.Fatal(err)
	}
	file = bd["file"].(map[string]any)
	if got := setFiles(t, m, a, file["filename"].(string)); !slices.Equal(got, []string{cfg.Disks[1].Path + " rw"}) {
		t.Errorf("c1 fd set holds %q, want its image read-write", got)
	}
	chardevs := argsAfter(a, "-chardev")
	for _, kind := range []fdKind{fdQMP, fdAgent} {
		found := false
		for _, c := range chardevs {
			if fd, ok := strings.CutPrefix(c, "socket,id="); ok && strings.HasSuffix(fd, ",server=on,wait=off") {
				n := strings.TrimSuffix(strings.SplitN(fd, ",fd=", 2)[1], ",server=on,wait=off")
				found = found || slotAt(t, m, "/proc/self/fd/"+n).kind == kind
			}
		}
		if !found {
			t.Errorf("chardevs %q: no socket on a passed listener of kind %d", chardevs, kind)
		}
	}
	if !slices.Contains(chardevs, "file,id=serial0,append=on,path=/dev/fdset/1") || setFiles(t, m, a, "/dev/fdset/1") != nil {
		t.Errorf("console chardev %q: want the pipe in fd set 1", chardevs)
	}
	for i, arg := range a {
		if i > 0 && a[i-1] == "-add-fd" {
			continue // labels only
		}
		if strings.Contains(arg, cfg.StateDir) || strings.Contains(arg, filepath.Dir(cfg.Kernel)) {
			t.Errorf("argument %q names a host path: a confined QEMU opens only what it is passed", arg)
		}
	}
	if want := "fd=6,set=1,opaque=" + filepath.Join(cfg.StateDir, ConsoleLogName); !slices.Contains(argsAfter(a, "-add-fd"), want) {
		t.Errorf("no -add-fd %s: the state dir must stay in the command line", want)
	}
	if slices.Contains(a, "-incoming") || slices.Contains(a, "-S") {
		t.Error("cold boot has -incoming or -S")
	}
}

func TestArgsIncomingSharedOff(t *testing.T) {
	cfg := unitConfig(t)
	cfg.Memory.Mode, cfg.Memory.Incoming = MemoryPrivate, true
	cfg.Accel, cfg.VCPUs, cfg.HotplugPorts = "kvm", 2, -1
	cfg.Disks[1].Port = "rp3" // hot-plugged at checkpoint time
	cfg.HotplugPorts = 4
	a := mustNew(t, cfg).Args()
	n := len(a)
	if a[n-3] != "-S" || a[n-2] != "-incoming" || a[n-1] != "defer" {
		t.Errorf("argv ends with %q", a[n-3:])
	}
	if !strings.Contains(argsAfter(a, "-object")[0], `"share":false`) {
		t.Errorf("memory backend %s is not share=false", argsAfter(a, "-object")[0])
	}
	if got := argsAfter(a, "-cpu"); got[0] != "host" {
		t.Errorf("kvm default cpu = %q", got)
	}
	m := mustNew(t, cfg)
	// The guest's kernel is in the snapshot's RAM: QEMU gets a stub of it
	// (kernelstub.go) and no initrd, not 17 MiB more of its own memory.
	if s := slotAt(t, m, argsAfter(a, "-kernel")[0]); s.kind != fdKernelStub || s.path != cfg.Kernel {
		t.Errorf("a restore's -kernel is %+v, want a stub of %s", s, cfg.Kernel)
	}
	if got := argsAfter(a, "-initrd"); len(got) != 0 {
		t.Errorf("a restore has -initrd %q", got)
	}
	if priv, ok := m.cfg.privateMemory(); !ok || m.ramFile() != priv || filepath.Dir(priv) != "/dev/shm" {
		t.Errorf("confined restore maps %s (private %s %v), want its own copy in /dev/shm", m.ramFile(), priv, ok)
	}
	sealed := cfg
	sealed.Memory.Sealed = true // its seals guard a node's base: no copy
	if s := mustNew(t, sealed); s.ramFile() != cfg.Memory.Path {
		t.Errorf("confined restore of a sealed base maps %s, want %s", s.ramFile(), cfg.Memory.Path)
	}
	cfg.Memory.Mode = MemoryServed // a page server guards its file itself: no copy
	if s := mustNew(t, cfg); s.ramFile() != cfg.Memory.Path {
		t.Errorf("confined restore of served memory maps %s, want %s", s.ramFile(), cfg.Memory.Path)
	}
	devs := argsAfter(a, "-device")
	port := slices.Index(devs, "pcie-root-port,id=rp3,bus=pcie.0,addr=0x13,chassis=4")
	disk := slices.Index(devs, "virtio-blk-pci,id=c1,drive=nc1,bus=rp3,addr=0x0,serial=c1")
	if port < 0 || disk < 0 || disk < port {
		t.Errorf("port at %d, disk on it at %d in\n%s", port, disk, strings.Join(devs, "\n"))
	}
}

func TestArgsCPUEnforceUnderKVM(t *testing.T) {
	for _, c := range []struct{ accel, model, want string }{
		{"kvm", "Skylake-Client-v4", "Skylake-Client-v4,enforce"},
		{"kvm", "host", "host"},
		{"kvm", "max", "max"},
		{"tcg", "qemu64", "qemu64"},
	} {
		cfg := unitConfig(t)
		cfg.Accel, cfg.CPUModel = c.accel, c.model
		if got := argsAfter(mustNew(t, cfg).Args(), "-cpu"); len(got) != 1 || got[0] != c.want {
			t.Errorf("%s %s: -cpu %q, want %q", c.accel, c.model, got, c.want)
		}
	}
}

func TestArgsConfinementOff(t *testing.T) {
	cfg := unitConfig(t)
	cfg.Confine.Disabled = true
	cfg.Memory.Mode, cfg.Memory.Incoming = MemoryPrivate, true
	m := mustNew(t, cfg)
	if slices.Contains(m.Args(), "-sandbox") {
		t.Error("-sandbox with confinement disabled")
	}
	if m.ramFile() != cfg.Memory.Path {
		t.Errorf("unconfined restore maps %s, want %s itself", m.ramFile(), cfg.Memory.Path)
	}
}

func TestArgsBackingChainIsPassed(t *testing.T) {
	cfg := unitConfig(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(base, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	mid, top := filepath.Join(dir, "mid.qcow2"), filepath.Join(dir, "top.qcow2")
	if err := qcow2.CreateOverlay(mid, base, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := qcow2.CreateOverlayOf(top, mid, "qcow2", 1<<20); err != nil {
		t.Fatal(err)
	}
	cfg.Disks = []Disk{{ID: "c1", Path: top, Format: "qcow2"}}
	m := mustNew(t, cfg)
	a := m.Args()
	var bd map[string]any
	if err := json.Unmarshal([]byte(argsAfter(a, "-blockdev")[0]), &bd); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		format string
		files  []string
	}{
		{"qcow2", []string{top + " rw"}},
		{"qcow2", []string{mid + " ro"}},
		{"raw", []string{base + " ro"}},
	}
	n := bd
	for i, w := range want {
		file := n["file"].(map[string]any)
		if got := setFiles(t, m, a, file["filename"].(string)); n["driver"] != w.format || !slices.Equal(got, w.files) || (i > 0) != (n["read-only"] == true) {
			t.Errorf("chain[%d] = %v with files %q, want %s with %q", i, n, got, w.format, w.files)
		}
		if file["drop-cache"] != false {
			t.Errorf("chain[%d]'s file %v: want drop-cache false (a cont after a checkpoint would drop its host page cache)", i, file)
		}
		b, has := n["backing"]
		switch {
		case i < 2 && !has:
			t.Fatalf("chain[%d] has no explicit backing: QEMU would open the header's name itself", i)
		case i < 2:
			n = b.(map[string]any)
		case has:
			t.Errorf("raw image with backing %v", b)
		}
	}
}

func TestImageChainRefusals(t *testing.T) {
	dir := t.TempDir()
	loop := filepath.Join(dir, "loop.qcow2")
	if err := qcow2.CreateOverlayOf(loop, loop, "qcow2", 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := imageChain(loop, "qcow2"); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("self-backed image: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	onFifo := filepath.Join(dir, "on-fifo.qcow2")
	if err := qcow2.CreateOverlay(onFifo, fifo, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := imageChain(onFifo, "qcow2"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("image over a fifo: %v", err)
	}
	// A raw image's bytes are the guest's: a qcow2 header in them is data.
	fake := filepath.Join(dir, "raw-with-header")
	if err := os.Rename(onFifo, fake); err != nil {
		t.Fatal(err)
	}
	if c, err := imageChain(fake, "raw"); err != nil || c.backing != nil {
		t.Errorf("raw image parsed as qcow2: %+v %v", c, err)
	}
}

func TestArgsNoHotplugPorts(t *testing.T) {
	cfg := unitConfig(t)
	cfg.HotplugPorts = -1
	for _, d := range mustNew(t, cfg).Args() {
		if strings.HasPrefix(d, "pcie-root-port") {
			t.Errorf("HotplugPorts=-1 still has %s", d)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no id", func(c *Config) { c.ID = "" }, "id is empty"},
		{"id with comma", func(c *Config) { c.ID = "a,b" }, "contains"},
		{"relative state dir", func(c *Config) { c.StateDir = "state" }, "not an absolute path"},
		{"state dir too long", func(c *Config) { c.StateDir = "/" + strings.Repeat("x", 100) }, "too long for unix sockets"},
		{"missing kernel", func(c *Config) { c.Kernel = "/nonexistent/vmlinuz" }, "kernel: stat /nonexistent/vmlinuz: no such file"},
		{"no kernel", func(c *Config) { c.Kernel = "" }, "no kernel"},
		{"initrd is a dir", func(c *Config) { c.Initrd = "/" }, "not a regular file"},
		{"unversioned q35", func(c *Config) { c.MachineType = "q35" }, "not versioned"},
		{"i440fx", func(c *Config) { c.MachineType = "pc-i440fx-7.2" }, "only pc-q35"},
		{"bad accel", func(c *Config) { c.Accel = "hvf" }, "accel"},
		{"bad cpu", func(c *Config) { c.CPUModel = "max,+vmx" }, "cpu model"},
		{"too little memory", func(c *Config) { c.MemoryMiB = 32 }, "at least 64"},
		{"relative memory path", func(c *Config) { c.Memory.Path = "ram" }, "memory path"},
		{"owned memory incoming", func(c *Config) { c.Memory.Incoming = true }, "owned with incoming"},
		{"private memory booted", func(c *Config) { c.Memory.Mode = MemoryPrivate }, "private without incoming"},
		{"unknown memory mode", func(c *Config) { c.Memory.Mode = MemoryServed + 1 }, "memory mode MemoryMode(3)"},
		{"sealed owned memory", func(c *Config) { c.Memory.Sealed = true }, "owned sealed"},
		{"too many vcpus", func(c *Config) { c.VCPUs = 65 }, "vcpus"},
		{"too many ports", func(c *Config) { c.HotplugPorts = 16 }, "hotplug ports"},
		{"duplicate disk", func(c *Config) { c.Disks[1].ID = "rootfs" }, "duplicate device id"},
		{"bad disk id", func(c *Config) { c.Disks[0].ID = "root fs" }, "disk id"},
		{"missing disk", func(c *Config) { c.Disks[0].Path = "/nonexistent.img" }, "no such file"},
		{"bad format", func(c *Config) { c.Disks[0].Format = "vmdk" }, "format"},
		{"long serial", func(c *Config) { c.Disks[0].Serial = strings.Repeat("s", 21) }, "serial"},
		{"bad port", func(c *Config) { c.Disks[0].Port = "pcie.0" }, "port"},
		{"port beyond count", func(c *Config) { c.Disks[0].Port = "rp9" }, "does not exist"},
		{"port twice", func(c *Config) { c.Disks[0].Port, c.Disks[1].Port = "rp1", "rp1" }, "already used"},
		{"nic without tap", func(c *Config) { c.NICs = []NIC{{ID: "eth0", MAC: "52:54:00:00:00:01"}} }, "no tap"},
		{"nic bad mac", func(c *Config) { c.NICs = []NIC{{ID: "eth0", Tap: os.Stdin, MAC: "nope"}} }, "mac"},
		{"nic clashes with disk", func(c *Config) { c.NICs = []NIC{{ID: "c1", Tap: os.Stdin, MAC: "52:54:00:00:00:01"}} }, "duplicate device id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := unitConfig(t)
			tc.mutate(&cfg)
			_, err := New(cfg)
			if err == nil {
				t.Fatal("New accepted the config")
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("error %v is not ErrInvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
	if _, err := New(unitConfig(t)); err != nil {
		t.Errorf("valid config refused: %v", err)
	}
}

func TestCheckRestore(t *testing.T) {
	cfg := unitConfig(t)
	cfg.QEMUVersion = "7.2.19"
	m := mustNew(t, cfg)
	saved := m.Fingerprint()
	if len(saved.KernelDigest) != len("sha256:")+64 || saved.QEMUVersion != "7.2.19" {
		t.Errorf("kernel digest %q, qemu version %q", saved.KernelDigest, saved.QEMUVersion)
	}
	if err := m.CheckRestore(saved); err != nil {
		t.Errorf("same machine: %v", err)
	}
	// Digests the caller knows are taken as given, not hashed again.
	known := cfg
	known.KernelSHA256, known.InitrdSHA256 = strings.Repeat("a", 64), strings.Repeat("b", 64)
	if fp := mustNew(t, known).Fingerprint(); fp.KernelDigest != "sha256:"+known.KernelSHA256 || fp.InitrdDigest != "sha256:"+known.InitrdSHA256 {
		t.Errorf("fingerprint with known digests: kernel %q initrd %q", fp.KernelDigest, fp.InitrdDigest)
	}
	cfg.MemoryMiB, cfg.CPUModel = 512, "max"
	cfg.Disks = cfg.Disks[:1]
	cfg.VMGenID = true
	cfg.QEMUVersion = "8.0.0" // knows pc-q35-7.2: not a difference
	err := mustNew(t, cfg).CheckRestore(saved)
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"MemoryMiB: snapshot 256, host 512", "CPUModel", "Devices[c1]: snapshot virtio-blk-pci@pcie.0/0x7, host has none", "Devices[vmgenid0]: snapshot has none, host vmgenid@/"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "QEMUVersion") {
		t.Errorf("a newer QEMU that knows the machine type refused: %v", err)
	}
}

// TestCheckHost: before there is a machine, what the host decides is
// checked against the snapshot's fingerprint; the VM's shape is not (the
// machine built from the snapshot has it).
func TestCheckHost(t *testing.T) {
	cfg := unitConfig(t)
	cfg.QEMUVersion = "7.2.19"
	saved := mustNew(t, cfg).Fingerprint()
	host := Config{QEMUPath: cfg.QEMUPath, Kernel: cfg.Kernel, Initrd: cfg.Initrd, MachineType: cfg.MachineType, CPUModel: cfg.CPUModel, Accel: cfg.Accel, QEMUVersion: "8.2.2"}
	if err := CheckHost(host, saved); err != nil {
		t.Errorf("the same host, a newer QEMU: %v", err)
	}
	for _, tc := range []struct {
		field string
		edit  func(c *Config)
	}{
		{"MachineType", func(c *Config) { c.MachineType = "pc-q35-8.0" }},
		{"CPUModel", func(c *Config) { c.CPUModel = "max" }},
		{"Accel", func(c *Config) { c.Accel = "kvm" }},
		{"QEMUVersion", func(c *Config) { c.QEMUVersion = "7.1.0" }},
		{"KernelDigest", func(c *Config) { c.KernelSHA256 = strings.Repeat("c", 64) }},
	} {
		c := host
		tc.edit(&c)
		if err := CheckHost(c, saved); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v", tc.field, err)
		}
	}
}

// TestArgsMemoryModes: a memory mode says the backend's share and which
// file QEMU maps (confined); Incoming alone says whether it starts paused
// for an incoming state, so that a booted VM maps a served file shared
// without -incoming.
func TestArgsMemoryModes(t *testing.T) {
	for _, c := range []struct {
		mode     MemoryMode
		share    string
		incoming bool
		ownCopy  bool
	}{
		{MemoryOwned, `"share":true`, false, false},
		{MemoryPrivate, `"share":false`, true, true},
		{MemoryServed, `"share":true`, true, false},
		{MemoryServed, `"share":true`, false, false},
	} {
		cfg := unitConfig(t)
		cfg.Memory.Mode, cfg.Memory.Incoming = c.mode, c.incoming
		m := mustNew(t, cfg)
		a := m.Args()
		if obj := argsAfter(a, "-object")[0]; !strings.Contains(obj, c.share) || !strings.Contains(obj, `"qom-type":"memory-backend-file"`) {
			t.Errorf("%v: memory backend %s, want %s", c.mode, obj, c.share)
		}
		if got := slices.Contains(a, "-incoming") && slices.Contains(a, "-S"); got != c.incoming {
			t.Errorf("%v: -S -incoming %v, want %v", c.mode, got, c.incoming)
		}
		if got := m.ramFile() != cfg.Memory.Path; got != c.ownCopy {
			t.Errorf("%v: maps %s (its own copy: %v), want own copy %v", c.mode, m.ramFile(), got, c.ownCopy)
		}
	}
}
