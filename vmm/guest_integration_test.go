//go:build integration

package vmm

// Helpers that boot a real QEMU with a tiny test guest: the Debian cloud
// kernel (CRYO_KERNEL, or `make guest` output) and an initrd built here from
// busybox-static with an /init that answers shell commands on the agent.0
// port, one line in, one line out.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// defaultGuestDir is where `make guest` writes vmlinuz and guest.json
// (relative to this package's directory, where `go test` runs).
const defaultGuestDir = "../_output/guest"

// testInit is the guest's PID 1. It loads the virtio modules, prints a ready
// line with a per-boot random token, ticks on the console, and serves the
// agent port: each line received is run by the shell and the output is sent
// back as one line.
//
// The port stays open for the whole boot, as cryo-agent keeps it: a read
// returns EOF while the guest has not yet seen the host connect, and closing
// the port then would make the kernel discard a command that QEMU had already
// queued for it (the host connects, writes, and waits for ever).
const testInit = `#!/bin/sh
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.load); do insmod /lib/modules/$m.ko || echo "insmod $m failed"; done
TOKEN=$(cat /proc/sys/kernel/random/uuid)
echo "cryo-test-ready token=$TOKEN"
( i=0; while true; do i=$((i+1)); echo $i > /tick; echo "tick $i blocks: $(ls /sys/block | tr '\n' ' ')"; sleep 2; done ) &
agentport() {
  for p in /sys/class/virtio-ports/*; do
    [ "$(cat $p/name 2>/dev/null)" = agent.0 ] && echo /dev/${p##*/}
  done
}
dev=$(agentport)
while [ -z "$dev" ] || ! exec 3<>$dev; do sleep 0.2; dev=$(agentport); done
while true; do
  while read -r line <&3; do echo "$(eval "$line" 2>&1 | tr '\n' ' ')" >&3; done
  sleep 0.05
done
`

// testModules are loaded in this order (dependencies first).
var testModules = []string{"virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci", "virtio_blk", "virtio_console", "failover", "net_failover", "virtio_net"}

var (
	guestOnce   sync.Once
	guestKernel string
	guestInitrd string
	guestErr    error
	guestDir    string // removed by TestMain
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		runHelper() // never returns
	}
	removeStaleRAMFiles()
	code := m.Run()
	if guestDir != "" {
		os.RemoveAll(guestDir)
	}
	os.Exit(code)
}

// removeStaleRAMFiles removes the RAM files of earlier test binaries that
// were killed before their cleanups ran (the file names carry their pid).
func removeStaleRAMFiles() {
	files, _ := filepath.Glob("/dev/shm/cryo-vmmtest-*.ram*")
	for _, f := range files {
		name := strings.TrimPrefix(filepath.Base(f), "cryo-vmmtest-")
		name = name[:strings.Index(name, ".ram")]
		pid, err := strconv.Atoi(name[strings.LastIndex(name, "-")+1:])
		if err == nil && pid != os.Getpid() && !alive(pid) {
			os.Remove(f)
		}
	}
}

// testGuest returns the kernel and the test initrd (built once per run).
func testGuest(t *testing.T) (kernel, initrd string) {
	t.Helper()
	guestOnce.Do(func() { guestKernel, guestInitrd, guestErr = buildGuest() })
	if guestErr != nil {
		t.Fatal(guestErr)
	}
	return guestKernel, guestInitrd
}

func buildGuest() (string, string, error) {
	kernel := os.Getenv("CRYO_KERNEL")
	if kernel == "" {
		dir := os.Getenv("CRYO_GUEST_DIR") // set by the Makefile
		if dir == "" {
			dir = defaultGuestDir
		}
		kernel, _ = filepath.Abs(filepath.Join(dir, "vmlinuz"))
	}
	if _, err := os.Stat(kernel); err != nil {
		return "", "", fmt.Errorf("no guest kernel (%v): run `make guest` or set CRYO_KERNEL to a vmlinuz of linux-image-cloud-amd64 (extracted with dpkg-deb -x, modules beside it; or CRYO_KERNEL_MODULES)", err)
	}
	modDir, err := findModules(kernel)
	if err != nil {
		return "", "", err
	}
	busybox := "/bin/busybox"
	if out, err := exec.Command("file", "-L", busybox).Output(); err != nil || !strings.Contains(string(out), "statically linked") {
		return "", "", fmt.Errorf("%s is not a static busybox: apt-get install busybox-static", busybox)
	}
	files := map[string]string{}
	for _, m := range testModules {
		p, err := findFile(modDir, m+".ko")
		if err != nil {
			return "", "", fmt.Errorf("module %s not under %s: %v", m, modDir, err)
		}
		files["lib/modules/"+m+".ko"] = p
	}
	guestDir, err = os.MkdirTemp("", "cryo-vmm-guest-")
	if err != nil {
		return "", "", err
	}
	initrd := filepath.Join(guestDir, "initrd.cpio")
	if err := writeInitrd(initrd, busybox, testInit, strings.Join(testModules, "\n")+"\n", files); err != nil {
		return "", "", fmt.Errorf("build test initrd: %w", err)
	}
	return kernel, initrd, nil
}

// findModules locates lib/modules/<version> for the kernel: CRYO_KERNEL_MODULES;
// for `make guest` output, the package cache named by guest.json beside the
// kernel; or beside the kernel as dpkg-deb -x lays it out (../lib/modules/<ver>,
// where <ver> is the vmlinuz-<ver> suffix or the only entry).
func findModules(kernel string) (string, error) {
	if d := os.Getenv("CRYO_KERNEL_MODULES"); d != "" {
		return d, nil
	}
	dir := filepath.Dir(kernel)
	if b, err := os.ReadFile(filepath.Join(dir, "guest.json")); err == nil {
		var g struct{ KernelPackage, KernelPackageVersion, KernelRelease string }
		if err := json.Unmarshal(b, &g); err == nil {
			cache := os.Getenv("CRYO_GUEST_CACHE")
			if cache == "" {
				cache = "/var/cache/cryo/guest"
			}
			d := filepath.Join(cache, g.KernelPackage+"_"+g.KernelPackageVersion, "x", "lib", "modules", g.KernelRelease)
			if _, err := os.Stat(d); err == nil {
				return d, nil
			}
		}
	}
	ver := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
	for _, root := range []string{filepath.Join(dir, "..", "lib", "modules"), filepath.Join(dir, "lib", "modules"), filepath.Join(dir, "modules")} {
		if st, err := os.Stat(filepath.Join(root, ver)); err == nil && st.IsDir() {
			return filepath.Join(root, ver), nil
		}
		if ents, err := os.ReadDir(root); err == nil && len(ents) == 1 && ents[0].IsDir() {
			return filepath.Join(root, ents[0].Name()), nil
		}
	}
	return "", fmt.Errorf("no kernel modules found beside %s: set CRYO_KERNEL_MODULES to its lib/modules/<version> directory", kernel)
}

func findFile(root, name string) (string, error) {
	var found string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == name {
			found = p
			return fs.SkipAll
		}
		return err
	})
	if err == nil && found == "" {
		err = fs.ErrNotExist
	}
	return found, err
}

// testConfig returns a valid config for a 256 MiB test guest whose RAM file
// and state directory are removed at the end of the test.
func testConfig(t *testing.T, id string) Config {
	t.Helper()
	kernel, initrd := testGuest(t)
	mem := fmt.Sprintf("/dev/shm/cryo-vmmtest-%s-%d.ram", id, os.Getpid())
	t.Cleanup(func() { os.Remove(mem) })
	return Config{
		ID:        id,
		StateDir:  t.TempDir(),
		Kernel:    kernel,
		Initrd:    initrd,
		Accel:     "tcg",
		MemoryMiB: 256,
		Memory:    Memory{Mode: MemoryOwned, Path: mem},
	}
}

// startVM creates and starts a machine; the cleanup shuts it down and fails
// the test if QEMU is still alive afterwards.
func startVM(t *testing.T, cfg Config) *Machine {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		pid := m.Pid()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Errorf("cleanup Shutdown: %v", err)
		}
		if alive(pid) {
			t.Errorf("qemu %d alive after Shutdown", pid)
		}
	})
	return m
}

// waitConsole waits until the guest console contains want and returns the
// console text.
func waitConsole(t *testing.T, m *Machine, want string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(m.ConsolePath())
		if strings.Contains(string(b), want) {
			return string(b)
		}
		select {
		case <-m.Exited():
			t.Fatalf("qemu exited while waiting for %q on the console: %v\nconsole:\n%s", want, m.Wait(context.Background()), b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("console has no %q after %v:\n%s\nqemu: %s", want, timeout, b, m.Stderr())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// agentConn is a connection to the test guest's command server.
type agentConn struct {
	m *Machine
	c net.Conn
	r *bufio.Reader
}

func dialAgent(t *testing.T, m *Machine) *agentConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := m.DialAgent(ctx)
	if err != nil {
		t.Fatalf("DialAgent: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &agentConn{m: m, c: c, r: bufio.NewReader(c)}
}

// run sends a shell command to the guest and returns its one-line output.
func (a *agentConn) run(t *testing.T, cmd string) string {
	t.Helper()
	a.c.SetDeadline(time.Now().Add(30 * time.Second))
	defer a.c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintln(a.c, cmd); err != nil {
		t.Fatalf("agent write %q: %v", cmd, err)
	}
	line, err := a.r.ReadString('\n')
	if err != nil {
		t.Fatalf("agent reply to %q: %v\nconsole (last 2 KiB):\n%s", cmd, err, tail(a.m.ConsolePath(), 2048))
	}
	return strings.TrimSpace(line)
}

// assertConfined checks that m's QEMU runs under its seccomp filter as an
// unprivileged uid of the configured range.
func assertConfined(t *testing.T, m *Machine) {
	t.Helper()
	uid, mode, err := ProcessConfinement(m.Pid())
	if err != nil {
		t.Fatal(err)
	}
	c := m.Config().Confine
	if mode != 2 || uid == 0 || uid < c.UIDBase || uid >= c.UIDBase+c.UIDCount {
		t.Errorf("qemu pid %d: uid %d, seccomp %d; want a uid in [%d,%d) and seccomp 2", m.Pid(), uid, mode, c.UIDBase, c.UIDBase+c.UIDCount)
	}
}
