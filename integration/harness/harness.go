// Package harness starts a private containerd with the cryo runtime for
// integration tests: a temporary root, state, socket and shim socket dir,
// the shim binary from CRYO_BIN, the guest image from CRYO_GUEST_DIR, and a
// test image imported from an OCI layout tar. Everything it starts is
// stopped, and everything it mounts or writes is removed, in t.Cleanup.
package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/testimage"
)

// Image is the busybox test image every Env imports.
const Image = "cryo.local/busybox:1"

// Runtime is cryo's runtime type.
const Runtime = "io.containerd.cryo.v2"

// Env is one private containerd.
type Env struct {
	t          testing.TB
	Dir        string // everything on disk
	Socket     string
	Namespace  string
	ConfigPath string // cryo's config.toml
	StateRoot  string // cryo's runtime.state_root
	Cfg        configs.Config
	LogPath    string
	cmd        *exec.Cmd
	path       string // PATH for containerd and ctr
}

// RepoRoot finds the repository root from the test's working directory.
func RepoRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	t.Fatalf("no go.mod above %s", dir)
	return ""
}

// Need fails the test unless the named binaries are on PATH, telling what to
// install.
func Need(t testing.TB, path string, bins ...string) {
	t.Helper()
	for _, b := range bins {
		if _, err := lookPath(b, path); err != nil {
			t.Fatalf("%s not found on PATH: run `make deps` (hack/deps.sh) to install it", b)
		}
	}
}

func lookPath(bin, path string) (string, error) {
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, bin)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}

// GuestDir returns the guest image directory (vmlinuz, initrd.img).
func GuestDir(t testing.TB) string {
	dir := os.Getenv("CRYO_GUEST_DIR")
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), "_output", "guest")
	}
	for _, f := range []string{"vmlinuz", "initrd.img"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("guest image file %s missing: run `make guest` (or set CRYO_GUEST_DIR)", filepath.Join(dir, f))
		}
	}
	return dir
}

// BinDir returns the directory with containerd-shim-cryo-v2 and cryoctl.
func BinDir(t testing.TB) string {
	dir := os.Getenv("CRYO_BIN")
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), "_output", "bin")
	}
	if _, err := os.Stat(filepath.Join(dir, "containerd-shim-cryo-v2")); err != nil {
		t.Fatalf("containerd-shim-cryo-v2 not in %s: run `make binaries` (or set CRYO_BIN)", dir)
	}
	return dir
}

// Option changes the cryo config before containerd starts.
type Option func(*configs.Config)

// Start starts a private containerd configured with the cryo runtime.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	return start(t, nil, opts...)
}

// start starts containerd; with cri set, with its CRI plugin (see cri.go).
func start(t testing.TB, cri *CRI, opts ...Option) *Env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("integration tests start containerd and QEMU and must run as root")
	}
	dir, err := os.MkdirTemp("", "cryo-it-")
	if err != nil {
		t.Fatal(err)
	}
	tools := os.Getenv("CRYO_TOOLS")
	if tools == "" {
		tools = "/var/cache/cryo/tools"
	}
	e := &Env{
		t: t, Dir: dir, Namespace: "cryo-test",
		Socket:    filepath.Join(dir, "c.sock"),
		StateRoot: "/run/cryo-it/" + filepath.Base(dir)[len("cryo-it-"):],
		LogPath:   filepath.Join(dir, "containerd.log"),
	}
	e.path = BinDir(t) + ":" + filepath.Join(tools, "bin") + ":" + os.Getenv("PATH")
	t.Cleanup(e.cleanup)
	Need(t, e.path, "containerd", "ctr", "qemu-system-x86_64", "qemu-img", "mkfs.ext4")

	guest := GuestDir(t)
	e.Cfg = configs.Default()
	e.Cfg.Hypervisor.Kernel = filepath.Join(guest, "vmlinuz")
	e.Cfg.Hypervisor.Initrd = filepath.Join(guest, "initrd.img")
	e.Cfg.Runtime.StateRoot = e.StateRoot
	e.Cfg.Runtime.ImageCache = filepath.Join(dir, "images")
	e.Cfg.Runtime.WritableDiskMiB = 256
	e.Cfg.Snapshot.CacheDir = filepath.Join(dir, "cache")
	e.Cfg.Runtime.DiskRoot = filepath.Join(dir, "disks")
	e.Cfg.Snapshot.LocalRoot = filepath.Join(dir, "store")
	e.Cfg.Stores.Allowed = []string{"file://" + filepath.Join(dir, "store") + "/"}
	e.Cfg.Hypervisor.MemoryMiB = 256
	for _, o := range opts {
		o(&e.Cfg)
	}
	e.ConfigPath = filepath.Join(dir, "cryo.toml")
	e.WriteConfig(e.ConfigPath, e.Cfg)

	scratch := filepath.Join(dir, "scratch.ext4")
	if err := os.Truncate(createEmpty(t, scratch), 256<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", scratch).CombinedOutput(); err != nil {
		t.Fatalf("mkfs scratch: %v: %s", err, out)
	}
	cfg := fmt.Sprintf(containerdConfig, dir, dir, e.Socket, e.Socket, dir, dir, scratch)
	if cri != nil {
		cfg = cri.containerdConfig(e, scratch)
		e.Namespace = CRINamespace
	}
	if err := os.WriteFile(filepath.Join(dir, "containerd.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(e.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	e.cmd = exec.Command(e.bin("containerd"), "--config", filepath.Join(dir, "containerd.toml"))
	if cri != nil {
		e.cmd = exec.Command("nsenter", "--net="+cri.NetNS, e.bin("containerd"), "--config", filepath.Join(dir, "containerd.toml"))
	}
	e.cmd.Env = append(os.Environ(), "PATH="+e.path)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := e.cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, _, err := e.ctr(10*time.Second, "version"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not come up:\n%s", e.LogTail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
	img := filepath.Join(dir, "busybox.tar")
	if err := testimage.WriteFile(img, Image, []string{"/bin/sh"}); err != nil {
		t.Fatal(err)
	}
	for _, sn := range []string{"overlayfs", "blockfile"} {
		e.MustCtr("image", "import", "--snapshotter", sn, img)
	}
	return e
}

func createEmpty(t testing.TB, p string) string {
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Bin resolves a binary on the Env's PATH (exec.Command would search the
// test process's PATH instead).
func (e *Env) Bin(name string) string { return e.bin(name) }

func (e *Env) bin(name string) string {
	if p, err := lookPath(name, e.path); err == nil {
		return p
	}
	return name
}

// WriteConfig writes a cryo config file.
func (e *Env) WriteConfig(path string, c configs.Config) {
	b, err := toml.Marshal(c)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// Ctr runs ctr against the private containerd with a 2 minute deadline.
func (e *Env) Ctr(args ...string) (stdout, stderr string, err error) {
	return e.ctr(2*time.Minute, args...)
}

func (e *Env) ctr(timeout time.Duration, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin("ctr"), append([]string{"-a", e.Socket, "-n", e.Namespace}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+e.path)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("ctr %s: timed out after %s", strings.Join(args, " "), timeout)
	}
	return out.String(), errb.String(), err
}

// CtrTTY runs ctr with a pseudo-terminal as its stdin and stdout (through
// util-linux's script), as a user at a terminal would: `ctr ... -t` needs one.
func (e *Env) CtrTTY(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q := []string{"ctr", "-a", e.Socket, "-n", e.Namespace}
	for _, a := range args {
		q = append(q, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	cmd := exec.CommandContext(ctx, "script", "-qec", strings.Join(q, " "), "/dev/null")
	cmd.Env = append(os.Environ(), "PATH="+e.path)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Cryoctl runs cryoctl with this Env's cryo config and namespace.
func (e *Env) Cryoctl(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin("cryoctl"), append([]string{"--config", e.ConfigPath}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+e.path)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// StoreURL is a file:// store reference under this Env's allowed store root.
func (e *Env) StoreURL(name string) string { return "file://" + filepath.Join(e.Dir, "store", name) }

// MustCtr runs ctr and fails the test on error.
func (e *Env) MustCtr(args ...string) string {
	e.t.Helper()
	out, errs, err := e.Ctr(args...)
	if err != nil {
		e.t.Fatalf("ctr %s: %v\nstdout: %s\nstderr: %s\ncontainerd log:\n%s", strings.Join(args, " "), err, out, errs, e.LogTail(30))
	}
	return out
}

// RunArgs returns `ctr run` arguments for the cryo runtime with this Env's
// config.
func (e *Env) RunArgs(extra ...string) []string {
	return append([]string{"run", "--runtime", Runtime, "--runtime-config-path", e.ConfigPath}, extra...)
}

// ExitCode returns the exit code of a ctr error.
func ExitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

// LogTail returns the last n lines of containerd's log.
func (e *Env) LogTail(n int) string {
	b, _ := os.ReadFile(e.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// QEMUPids returns the QEMU processes started under this Env's state root.
func (e *Env) QEMUPids() []int { return procsMatching("qemu-system", e.StateRoot) }

// ShimPids returns the cryo shim processes serving this Env's namespace.
func (e *Env) ShimPids() []int { return procsMatching("containerd-shim-cryo-v2", e.Socket) }

func procsMatching(name, arg string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cl := string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		if strings.Contains(cl, name) && strings.Contains(cl, arg) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// WaitFor polls cond until it is true or timeout passes.
func WaitFor(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

func (e *Env) cleanup() {
	if keep := os.Getenv("CRYO_KEEP_LOG"); keep != "" {
		// for debugging: keep containerd's (and the shims') log
		if b, err := os.ReadFile(e.LogPath); err == nil {
			_ = os.WriteFile(keep, b, 0o600)
		}
	}
	if e.cmd != nil && e.cmd.Process != nil {
		// Remove what is left through containerd first, so shims clean up.
		if out, _, err := e.ctr(20*time.Second, "task", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				_, _, _ = e.ctr(20*time.Second, "task", "rm", "-f", id)
			}
		}
		if out, _, err := e.ctr(20*time.Second, "c", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				_, _, _ = e.ctr(20*time.Second, "c", "rm", id)
			}
		}
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = e.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = e.cmd.Process.Kill()
			<-done
		}
	}
	leaked := append(e.QEMUPids(), e.ShimPids()...)
	for _, pid := range leaked {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if len(leaked) > 0 && e.t != nil {
		e.t.Errorf("leaked processes after the test: %v", leaked)
	}
	unmountUnder(e.Dir)
	_ = os.RemoveAll(e.StateRoot)
	_ = os.RemoveAll(e.Dir)
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mps []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mps = append(mps, f[4])
		}
	}
	for i := len(mps) - 1; i >= 0; i-- {
		_ = syscall.Unmount(mps[i], syscall.MNT_DETACH)
	}
}

const containerdConfig = `version = 3
root = "%s/root"
state = "%s/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri", "io.containerd.podsandbox.controller.v1.podsandbox", "io.containerd.sandbox.controller.v1.shim"]

[grpc]
  address = "%s"

[ttrpc]
  address = "%s.ttrpc"

[debug]
  level = "debug"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "%s/opt"
  [plugins."io.containerd.shim.v1.manager"]
    socket_dir = "%s/s"
  [plugins."io.containerd.snapshotter.v1.blockfile"]
    scratch_file = "%s"
    fs_type = "ext4"
    mount_options = ["loop"]
    recreate_scratch = true
  [plugins."io.containerd.transfer.v1.local"]
    [[plugins."io.containerd.transfer.v1.local".unpack_config]]
      platform = "linux/amd64"
      snapshotter = "overlayfs"
    [[plugins."io.containerd.transfer.v1.local".unpack_config]]
      platform = "linux/amd64"
      snapshotter = "blockfile"
`
