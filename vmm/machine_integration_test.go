//go:build integration

package vmm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestBootQueryStatusPauseResume(t *testing.T) {
	cfg := testConfig(t, "boot")
	cfg.Disks = []Disk{{ID: "data0", Path: rawDisk(t, 16), Serial: "cryo-data0"}}
	cfg.VMGenID = true
	m := startVM(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if st, err := m.Status(ctx); err != nil || st != "running" {
		t.Fatalf("status = %q, %v; want running", st, err)
	}
	waitConsole(t, m, "cryo-test-ready", 60*time.Second)
	assertConfined(t, m)
	a := dialAgent(t, m)
	if got := a.run(t, "echo hello-$((6*7))"); got != "hello-42" {
		t.Fatalf("agent replied %q", got)
	}
	if got := a.run(t, "cat /sys/block/vda/serial"); got != "cryo-data0" {
		t.Errorf("guest serial of vda = %q, want cryo-data0", got)
	}
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := m.Status(ctx); st != "paused" {
		t.Errorf("status after Pause = %q", st)
	}
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := m.Status(ctx); st != "running" {
		t.Errorf("status after Resume = %q", st)
	}
	if got := a.run(t, "cat /sys/class/virtio-ports/*/name"); got != AgentPortName {
		t.Errorf("guest ports: %q", got)
	}
	fp := m.Fingerprint()
	if !strings.HasPrefix(fp.QEMUVersion, "7.2") || fp.MachineType != "pc-q35-7.2" || len(fp.KernelDigest) != 71 || len(fp.InitrdDigest) != 71 {
		t.Errorf("fingerprint = %+v", fp)
	}
	// The devices QEMU reports sit where the layout put them.
	var pci []struct {
		Devices []struct {
			Slot   int    `json:"slot"`
			QdevID string `json:"qdev_id"`
		} `json:"devices"`
	}
	if err := m.execute(ctx, "query-pci", nil, &pci); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, d := range pci[0].Devices {
		got[d.QdevID] = d.Slot
	}
	for _, d := range m.Devices() {
		if d.Bus != "pcie.0" {
			continue
		}
		if s, ok := got[d.ID]; !ok || s != d.slot() {
			t.Errorf("device %s: qemu slot %d (present %v), layout %s", d.ID, s, ok, d.Addr)
		}
	}
}

func TestSaveStateLoadStateRestoresGuest(t *testing.T) {
	cfg := testConfig(t, "save")
	disk := rawDisk(t, 16)
	cfg.Disks = []Disk{{ID: "data0", Path: disk, Serial: "cryo-data0"}}
	src := startVM(t, cfg)
	waitConsole(t, src, "cryo-test-ready", 60*time.Second)
	a := dialAgent(t, src)
	token := a.run(t, "echo $TOKEN")
	if len(token) != 36 {
		t.Fatalf("token = %q", token)
	}
	a.run(t, "echo written-before-save > /tmp/mark")
	a.c.Close() // the restored guest must serve a new connection
	if n := kernelCopies(t, src); n != 1 {
		t.Errorf("booted qemu holds %d copies of the kernel in its own memory, want 1 (QEMU 7.2 keeps it for fw_cfg): the check below would prove nothing", n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	statePath := filepath.Join(t.TempDir(), "devstate")
	w, err := os.OpenFile(statePath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := src.SaveState(ctx, w); err != nil {
		t.Fatalf("SaveState: %v", err)
	}
	w.Close()
	st, _ := os.Stat(statePath)
	t.Logf("SaveState took %v, device state %d bytes", time.Since(start), st.Size())
	if st.Size() == 0 || st.Size() > 16<<20 {
		t.Errorf("device state is %d bytes; with x-ignore-shared it should be small but not empty", st.Size())
	}
	if s, _ := src.Status(ctx); s != "postmigrate" {
		t.Errorf("source status after SaveState = %q, want postmigrate (paused)", s)
	}

	ram := keepRAM(t, src)
	var st0 syscall.Stat_t
	if err := syscall.Stat(ram, &st0); err != nil || st0.Uid != 0 || st0.Gid != 0 {
		t.Errorf("kept RAM file owned by %d:%d (%v) after its qemu's uid was freed, want root", st0.Uid, st0.Gid, err)
	}
	if _, err := os.Stat(cfg.Memory.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("owned RAM file still there after Shutdown: %v", err)
	}
	ramSum := fileSHA256(ram)

	dcfg := cfg
	dcfg.StateDir = t.TempDir()
	dcfg.Memory = Memory{Mode: MemoryPrivate, Path: ram, Incoming: true}
	dst := startVM(t, dcfg)
	if s, _ := dst.Status(ctx); s != "inmigrate" {
		t.Errorf("incoming status = %q, want inmigrate", s)
	}
	r, err := os.Open(statePath)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	start = time.Now()
	if err := dst.LoadState(ctx, r); err != nil {
		t.Fatalf("LoadState: %v", err)
	}
	if s, _ := dst.Status(ctx); s != "paused" {
		t.Errorf("status after LoadState = %q, want paused", s)
	}
	if err := dst.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	b := dialAgent(t, dst)
	t.Logf("LoadState+Resume+agent answer took %v", time.Since(start))
	assertConfined(t, dst)
	if n := kernelCopies(t, dst); n != 0 {
		t.Errorf("restored qemu holds %d copies of the kernel in its own memory, want none (it gets a stub)", n)
	}
	if priv, _ := dst.cfg.privateMemory(); priv == "" || dst.ramFile() != priv {
		t.Errorf("restored qemu maps %s, want its private copy of %s", dst.ramFile(), ram)
	}
	if got := b.run(t, "echo $TOKEN"); got != token {
		t.Errorf("restored guest token = %q, want %q (the guest rebooted instead of resuming?)", got, token)
	}
	if got := b.run(t, "cat /tmp/mark"); got != "written-before-save" {
		t.Errorf("restored guest /tmp/mark = %q", got)
	}
	b.run(t, "dd if=/dev/zero of=/tmp/fill bs=1M count=8 2>/dev/null; echo done")
	if got := fileSHA256(ram); got != ramSum {
		t.Errorf("share=off guest wrote through to the RAM file")
	}
	if err := dst.LoadState(ctx, r); err == nil {
		t.Error("second LoadState succeeded")
	}
	if err := src.LoadState(ctx, r); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("LoadState on a non-incoming machine: %v", err)
	}
}

func TestLoadStateMismatchCarriesQEMUError(t *testing.T) {
	cfg := testConfig(t, "mism")
	src := startVM(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	statePath := filepath.Join(t.TempDir(), "devstate")
	w, err := os.Create(statePath)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.SaveState(ctx, w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	ram := cfg.Memory.Path + ".saved"
	if err := os.Link(cfg.Memory.Path, ram); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(ram) })

	// A destination with a disk the source did not have: QEMU refuses the stream.
	dcfg := cfg
	dcfg.StateDir, dcfg.Memory = t.TempDir(), Memory{Mode: MemoryPrivate, Path: ram, Incoming: true}
	dcfg.Disks = []Disk{{ID: "extra", Path: rawDisk(t, 4)}}
	dcfg.HotplugPorts = 2
	dst := startVM(t, dcfg)
	r, _ := os.Open(statePath)
	defer r.Close()
	err = dst.LoadState(ctx, r)
	if err == nil {
		t.Fatal("LoadState into a different machine succeeded")
	}
	t.Logf("LoadState error: %v", err)
	if !strings.Contains(err.Error(), "qemu") || !strings.Contains(err.Error(), "load of migration failed") {
		t.Errorf("error does not carry QEMU's message: %v", err)
	}
	select {
	case <-dst.Exited():
	case <-time.After(10 * time.Second):
		t.Error("qemu still running after a failed incoming migration")
	}
}

func TestHotplugAndUnplugDisk(t *testing.T) {
	m := startVM(t, testConfig(t, "hotplug"))
	waitConsole(t, m, "cryo-test-ready", 60*time.Second)
	a := dialAgent(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	d := Disk{ID: "hp1", Path: rawDisk(t, 8), Serial: "cryo-hp1"}
	if err := m.HotplugDisk(ctx, d); err != nil {
		t.Fatalf("HotplugDisk: %v", err)
	}
	waitGuest(t, a, "cat /sys/block/vd*/serial", func(s string) bool { return strings.Contains(s, "cryo-hp1") })
	assertConfined(t, m)
	waitGuest(t, a, "dd if=/dev/zero of=/dev/vda bs=4k count=1 2>&1 && echo wrote", func(s string) bool { return strings.Contains(s, "wrote") })
	disks := m.Disks()
	if len(disks) != 1 || disks[0].Port != "rp0" {
		t.Errorf("Disks() = %+v, want hp1 on rp0", disks)
	}
	if err := m.HotplugDisk(ctx, d); !errdefs.IsAlreadyExists(err) {
		t.Errorf("hot-plugging the same id again: %v", err)
	}
	ro := Disk{ID: "hp2", Path: rawDisk(t, 8), Serial: "cryo-hp2", ReadOnly: true, Port: "rp5"}
	if err := m.HotplugDisk(ctx, ro); err != nil {
		t.Fatalf("HotplugDisk read-only: %v", err)
	}
	waitGuest(t, a, "cat /sys/block/vd*/ro", func(s string) bool { return strings.Contains(s, "1") })
	if err := m.UnplugDisk(ctx, "hp1"); err != nil {
		t.Fatalf("UnplugDisk: %v", err)
	}
	waitGuest(t, a, "cat /sys/block/vd*/serial", func(s string) bool { return !strings.Contains(s, "cryo-hp1") })
	if got := m.Disks(); len(got) != 1 || got[0].ID != "hp2" || got[0].Port != "rp5" {
		t.Errorf("Disks() after unplug = %+v", got)
	}
	if err := m.UnplugDisk(ctx, "hp1"); !errdefs.IsNotFound(err) {
		t.Errorf("unplugging a gone disk: %v", err)
	}
	// The freed port is reused.
	if err := m.HotplugDisk(ctx, Disk{ID: "hp3", Path: rawDisk(t, 8), Serial: "cryo-hp3"}); err != nil {
		t.Fatal(err)
	}
	for _, x := range m.Disks() {
		if x.ID == "hp3" && x.Port != "rp0" {
			t.Errorf("hp3 on %s, want the freed rp0", x.Port)
		}
	}
}

func TestSnapshotDiskFreezesImage(t *testing.T) {
	cfg := testConfig(t, "snap")
	base := rawDisk(t, 8)
	cfg.Disks = []Disk{{ID: "data0", Path: base, Serial: "cryo-data0"}}
	m := startVM(t, cfg)
	waitConsole(t, m, "cryo-test-ready", 60*time.Second)
	a := dialAgent(t, m)
	a.run(t, "echo before-snapshot | dd of=/dev/vda bs=512 count=1 conv=sync 2>/dev/null; sync")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Three keep-running checkpoints, each freezing the previous overlay:
	// device state saved, then the guest goes on (cont re-activates the
	// images the migration inactivated).
	var overlay string
	for i := 0; i < 3; i++ {
		overlay = filepath.Join(t.TempDir(), fmt.Sprintf("data0-%d.qcow2", i))
		if err := m.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.SnapshotDisk(ctx, "data0", overlay); err != nil {
			t.Fatalf("SnapshotDisk %d: %v", i, err)
		}
		w, err := os.Create(filepath.Join(t.TempDir(), "devstate"))
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if err := m.SaveState(ctx, w); err != nil {
			t.Fatalf("SaveState %d: %v", i, err)
		}
		if err := m.Resume(ctx); err != nil {
			t.Fatalf("Resume after checkpoint %d: %v", i, err)
		}
		if st, _ := m.Status(ctx); st != "running" {
			t.Errorf("status after checkpoint %d and Resume = %q", i, st)
		}
		a.run(t, fmt.Sprintf("echo on-overlay-%d | dd of=/dev/vda bs=512 seek=8 count=1 conv=sync 2>/dev/null; sync", i))
	}
	frozen := fileSHA256(base)
	a.run(t, "echo after-snapshot | dd of=/dev/vda bs=512 count=1 conv=sync 2>/dev/null; sync")
	if got := a.run(t, "head -c 14 /dev/vda"); got != "after-snapshot" {
		t.Errorf("guest reads %q from vda", got)
	}
	if fileSHA256(base) != frozen {
		t.Error("base image changed after SnapshotDisk")
	}
	b, _ := os.ReadFile(base)
	if !strings.HasPrefix(string(b), "before-snapshot") {
		t.Errorf("base image starts with %q", b[:16])
	}
	if st, err := os.Stat(overlay); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("overlay: %v, %v", st, err)
	}
	if d := m.Disks()[0]; d.Path != overlay || d.Format != "qcow2" {
		t.Errorf("Disks()[0] = %+v", d)
	}
}

// waitGuest runs cmd in the guest until ok accepts its output.
func waitGuest(t *testing.T, a *agentConn, cmd string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out := a.run(t, cmd)
		if ok(out) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest %q still gives %q", cmd, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// keepRAM keeps the RAM of a saved machine: it hard-links the owned file
// (removed when the test ends), then stops the machine, whose own file
// goes with it.
func keepRAM(t *testing.T, src *Machine) string {
	t.Helper()
	ram := src.Config().Memory.Path + ".saved"
	if err := os.Link(src.Config().Memory.Path, ram); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(ram) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := src.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	return ram
}

// rawDisk creates a zeroed raw image of n MiB.
func rawDisk(t *testing.T, n int64) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "disk-*.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(n << 20); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// TestRestoreWithHotpluggedDisk checks the flow the shim uses: disks
// hot-plugged before a checkpoint are passed to the restored machine in
// Config.Disks with their Port (Machine.Disks), so the layouts match.
func TestRestoreWithHotpluggedDisk(t *testing.T) {
	cfg := testConfig(t, "hprest")
	cfg.VMGenID = true // a new generation id on restore must not break the load
	src := startVM(t, cfg)
	waitConsole(t, src, "cryo-test-ready", 60*time.Second)
	a := dialAgent(t, src)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := src.HotplugDisk(ctx, Disk{ID: "c1", Path: rawDisk(t, 8), Serial: "cryo-c1", Port: "rp2"}); err != nil {
		t.Fatal(err)
	}
	waitGuest(t, a, "cat /sys/block/vd*/serial", func(s string) bool { return s == "cryo-c1" })
	a.run(t, "echo on-c1 | dd of=/dev/vda bs=512 count=1 conv=sync 2>/dev/null; sync")
	token := a.run(t, "echo $TOKEN")
	a.c.Close()

	statePath := filepath.Join(t.TempDir(), "devstate")
	w, _ := os.Create(statePath)
	if err := src.SaveState(ctx, w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	disks := src.Disks()
	saved := src.Fingerprint()
	ram := keepRAM(t, src)

	dcfg := cfg
	dcfg.StateDir, dcfg.Memory = t.TempDir(), Memory{Mode: MemoryPrivate, Path: ram, Incoming: true}
	dcfg.Disks = disks
	dm, err := New(dcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := dm.CheckRestore(saved); err != nil {
		t.Fatalf("CheckRestore: %v", err)
	}
	dst := startVM(t, dcfg)
	r, _ := os.Open(statePath)
	defer r.Close()
	if err := dst.LoadState(ctx, r); err != nil {
		t.Fatalf("LoadState: %v", err)
	}
	if err := dst.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	b := dialAgent(t, dst)
	assertConfined(t, dst)
	if priv, _ := dst.cfg.privateMemory(); priv == "" || dst.ramFile() != priv {
		t.Errorf("restored qemu maps %s, want its private copy of %s", dst.ramFile(), ram)
	}
	if got := b.run(t, "echo $TOKEN"); got != token {
		t.Errorf("token %q, want %q", got, token)
	}
	if got := b.run(t, "head -c 5 /dev/vda"); got != "on-c1" {
		t.Errorf("restored guest reads %q from the hot-plugged disk", got)
	}
	// And it can still be unplugged from the restored machine.
	if err := dst.UnplugDisk(ctx, "c1"); err != nil {
		t.Fatalf("UnplugDisk after restore: %v", err)
	}
	waitGuest(t, b, "ls /sys/block", func(s string) bool { return s == "" })
}

// TestConsoleFloodIsCapped: a guest writing its serial console without end
// leaves a console log no larger than the cap, whose tail is the newest
// output.
func TestConsoleFloodIsCapped(t *testing.T) {
	cfg := testConfig(t, "flood")
	cfg.ConsoleMaxBytes = 16 << 10
	m := startVM(t, cfg)
	waitConsole(t, m, "cryo-test-ready", 60*time.Second)
	a := dialAgent(t, m)
	a.run(t, "head -c 400000 /dev/zero | tr '\\000' x > /dev/ttyS0; echo flood-end > /dev/ttyS0; echo sent")
	waitConsole(t, m, "flood-end", 60*time.Second)
	st, err := os.Stat(m.ConsolePath())
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > cfg.ConsoleMaxBytes {
		t.Errorf("console log is %d bytes after a 400 kB flood, cap %d", st.Size(), cfg.ConsoleMaxBytes)
	}
	if b, _ := os.ReadFile(m.ConsolePath()); !strings.HasPrefix(string(b), consoleTruncated) {
		t.Errorf("console log of %d bytes does not start with the truncation mark: the flood did not reach it", len(b))
	}
	if tail := ConsoleTail(m.ConsolePath(), 2000); !strings.HasSuffix(tail, "flood-end") {
		t.Errorf("console tail ends %q", tail[max(0, len(tail)-40):])
	}
}

// kernelCopies counts the anonymous, non-executable mappings of m's QEMU
// with at least as many resident bytes as its kernel file past the setup
// sectors (at most 128 KiB): QEMU 7.2 reads -kernel into one such mapping
// (a malloc of the protected-mode part) and keeps it. The translation buffer (rwx) and the heap are smaller or
// excluded.
func kernelCopies(t *testing.T, m *Machine) int {
	t.Helper()
	st, err := os.Stat(m.Config().Kernel)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", m.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	n, anon := 0, false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && len(f[1]) == 4:
			anon = len(f) == 5 && f[1] != "rwxp" // no name: anonymous
		case anon && len(f) == 3 && f[0] == "Rss:":
			if kib, _ := strconv.ParseInt(f[1], 10, 64); kib<<10 >= st.Size()-128<<10 {
				n++
			}
		}
	}
	return n
}
