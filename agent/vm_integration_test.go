//go:build integration

package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/agent"
	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
)

const testMAC = "52:54:00:12:34:56"

// testVM is one real QEMU guest booted from the guest image, with disks.
type testVM struct {
	dir     string
	sock    string
	qmp     string
	console string
	args    []string // without the per-instance sockets
	cmd     *exec.Cmd
	exited  chan error
}

// guestDir is where packaging/guest/build.sh put the image.
func guestDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CRYO_GUEST_DIR")
	if dir == "" {
		dir = "../_output/guest"
	}
	for _, f := range []string{"vmlinuz", "initrd.img", "guest.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("guest image missing (%v): run `make guest` (packaging/guest/build.sh _output/guest) or set CRYO_GUEST_DIR", err)
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("CRYO_GUEST_DIR") == "" {
		checkFresh(t, filepath.Join(abs, "initrd.img"))
	}
	return abs
}

// checkFresh fails when agent sources changed after the initrd was built: the
// test would exercise an old agent.
func checkFresh(t *testing.T, initrd string) {
	t.Helper()
	fi, err := os.Stat(initrd)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{".", "../cmd/cryo-agent"} {
		filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
			if err == nil && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") && info.ModTime().After(fi.ModTime()) {
				t.Fatalf("%s is newer than %s: rebuild the guest image (make guest)", p, initrd)
			}
			return nil
		})
	}
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: apt-get install qemu-system-x86 e2fsprogs busybox-static", tool)
		}
	}
}

// makeRootfs builds an ext4 image holding a busybox root filesystem.
func makeRootfs(t *testing.T, img string) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "echo", "cat", "sleep", "hostname", "pwd", "env", "ls", "ps", "id", "stty", "test", "true", "kill", "touch", "readlink", "mount", "tr", "date", "ip"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nnogroup:x:65534:\n"), 0o644)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", root, img, "64M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
}

// startVM boots the guest with one disk per serial.
func startVM(t *testing.T, serials ...string) *testVM {
	t.Helper()
	needTools(t, "qemu-system-x86_64", "mkfs.ext4", "busybox")
	g := guestDir(t)
	dir, err := os.MkdirTemp("", "cryo-agent-vm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	args := []string{
		"-machine", "pc-q35-7.2", "-accel", "tcg", "-cpu", "qemu64", "-m", "512", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", filepath.Join(g, "vmlinuz"), "-initrd", filepath.Join(g, "initrd.img"),
		"-append", "console=ttyS0 panic=-1 quiet cryo.debug=1",
		"-device", "virtio-serial-pci,id=vser0,addr=0x3",
		"-device", "virtserialport,bus=vser0.0,chardev=c0,name=agent.0",
		// a NIC for UpdateInterface; restrict=on: nothing leaves the host
		"-netdev", "user,id=n0,restrict=on",
		"-device", "virtio-net-pci,netdev=n0,mac=" + testMAC + ",addr=0x8",
	}
	for i, s := range serials {
		img := filepath.Join(dir, s+".img")
		makeRootfs(t, img)
		args = append(args,
			"-drive", fmt.Sprintf("file=%s,if=none,id=d%d,format=raw,cache=unsafe", img, i),
			"-device", fmt.Sprintf("virtio-blk-pci,drive=d%d,serial=%s,addr=0x%x", i, s, 4+i))
	}
	return launch(t, dir, "boot", args, nil)
}

// launch starts QEMU with args plus its own agent socket, QMP socket and
// console (named after name); incoming, if set, is a migration stream to load.
func launch(t *testing.T, dir, name string, args []string, incoming *os.File) *testVM {
	t.Helper()
	vm := &testVM{
		dir: dir, args: args, exited: make(chan error, 1),
		sock:    filepath.Join(dir, name+"-agent.sock"),
		qmp:     filepath.Join(dir, name+"-qmp.sock"),
		console: filepath.Join(dir, name+"-console.log"),
	}
	full := append(append([]string(nil), args...),
		"-serial", "file:"+vm.console,
		"-qmp", "unix:"+vm.qmp+",server=on,wait=off",
		"-chardev", "socket,path="+vm.sock+",server=on,wait=off,id=c0")
	if incoming != nil {
		full = append(full, "-incoming", "fd:3")
	}
	vm.cmd = exec.Command("qemu-system-x86_64", full...)
	if incoming != nil {
		vm.cmd.ExtraFiles = []*os.File{incoming}
	}
	stderr, err := os.Create(filepath.Join(dir, name+"-qemu.stderr"))
	if err != nil {
		t.Fatal(err)
	}
	vm.cmd.Stdout, vm.cmd.Stderr = stderr, stderr
	if err := vm.cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	go func() { vm.exited <- vm.cmd.Wait(); stderr.Close() }()
	t.Cleanup(func() {
		vm.cmd.Process.Kill()
		err := <-vm.exited
		vm.exited <- err
		if t.Failed() {
			b, _ := os.ReadFile(vm.console)
			t.Logf("dump of the guest console (%s):\n%s", name, b)
			b, _ = os.ReadFile(filepath.Join(dir, name+"-qemu.stderr"))
			t.Logf("dump of qemu stderr (%s):\n%s", name, b)
		}
	})
	return vm
}

// dial connects to the agent socket (QEMU creates it shortly after start).
func (vm *testVM) dial(t *testing.T) *agent.Client {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.Dial("unix", vm.sock)
		if err == nil {
			c := agent.NewClient(conn)
			t.Cleanup(func() { c.Close() })
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial agent: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func consoleTail(vm *testVM) string {
	b, _ := os.ReadFile(vm.console)
	s := string(b)
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return s
}

// testSpec is a spec like containerd's default one.
func testSpec(args ...string) *specs.Spec {
	return &specs.Spec{
		Version:  specs.Version,
		Process:  &specs.Process{Args: args, Env: []string{"PATH=/bin", "FOO=bar"}, Cwd: "/tmp"},
		Root:     &specs.Root{Path: "rootfs"},
		Hostname: "box",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "bind", Source: "/run/containerd/sandbox/shm", Options: []string{"rbind", "ro"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/hosts", Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces:  []specs.LinuxNamespace{{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "network", Path: "/var/run/netns/x"}},
			MaskedPaths: []string{"/proc/kcore", "/sys/firmware"},
			Resources:   &specs.LinuxResources{},
		},
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readAll long-polls a stream until eof.
func readAll(t *testing.T, ctx context.Context, c *agent.Client, cid, eid string, s agentapi.Stream) string {
	t.Helper()
	var out strings.Builder
	for {
		r, err := c.ReadStdio(ctx, &agentapi.ReadStdioRequest{ContainerId: cid, ExecId: eid, Stream: s})
		if err != nil {
			t.Fatalf("read %v of %s/%s: %v", s, cid, eid, err)
		}
		out.Write(r.Data)
		if r.Eof {
			return out.String()
		}
	}
}

// readUntil reads stream s of cid/eid until what it read holds want, and
// returns what it read.
func readUntil(t *testing.T, ctx context.Context, c *agent.Client, cid, eid string, s agentapi.Stream, want string) string {
	t.Helper()
	var out strings.Builder
	for !strings.Contains(out.String(), want) {
		r, err := c.ReadStdio(ctx, &agentapi.ReadStdioRequest{ContainerId: cid, ExecId: eid, Stream: s})
		if err != nil {
			t.Fatalf("read %v of %s/%s: %v", s, cid, eid, err)
		}
		out.Write(r.Data)
		if r.Eof {
			t.Fatalf("%v of %s/%s ended before %q: %q", s, cid, eid, want, out.String())
		}
	}
	return out.String()
}

// mustRun creates a container and starts its init.
func mustRun(t *testing.T, ctx context.Context, c *agent.Client, req *agentapi.CreateContainerRequest) {
	t.Helper()
	if _, err := c.CreateContainer(ctx, req); err != nil {
		t.Fatalf("create %s: %v", req.Id, err)
	}
	if _, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: req.Id}); err != nil {
		t.Fatalf("start %s: %v", req.Id, err)
	}
}

// runExec runs an exec process to completion and returns stdout and exit status.
func runExec(t *testing.T, ctx context.Context, c *agent.Client, cid, eid string, args ...string) (string, uint32) {
	t.Helper()
	_, err := c.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: cid, ExecId: eid, Stdout: true, Stderr: true,
		ProcessJson: mustJSON(t, &specs.Process{Args: args, Env: []string{"PATH=/bin"}, Cwd: "/"})})
	if err != nil {
		t.Fatalf("exec %s: %v", eid, err)
	}
	if _, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: cid, ExecId: eid}); err != nil {
		t.Fatalf("start exec %s: %v", eid, err)
	}
	out := readAll(t, ctx, c, cid, eid, agentapi.Stream_STREAM_STDOUT)
	w, err := c.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: cid, ExecId: eid})
	if err != nil {
		t.Fatalf("wait exec %s: %v", eid, err)
	}
	if _, err := c.DeleteProcess(ctx, &agentapi.DeleteProcessRequest{ContainerId: cid, ExecId: eid}); err != nil {
		t.Fatalf("delete exec %s: %v", eid, err)
	}
	return out, w.ExitStatus
}
