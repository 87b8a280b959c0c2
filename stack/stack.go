// Package stack starts a private containerd with the cryo runtime: a
// temporary root, state, socket and shim socket dir, the shim binary from
// CRYO_BIN, the guest image from CRYO_GUEST_DIR, the tools from CRYO_TOOLS,
// and a busybox test image imported from an OCI layout tar. Close stops
// everything it started and removes everything it mounted or wrote.
//
// The integration tests use it through integration/harness (a testing.TB
// wrapper); `cryoctl bench` uses it directly.
package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/internal/busybox"
	"github.com/cryo-runtime/cryo/internal/watchdog"
)

// Image is the busybox test image every Stack imports.
const Image = "cryo.local/busybox:1"

// Options say where the parts come from; empty fields take the CRYO_*
// environment variables, then the repository's _output directory.
type Options struct {
	BinDir   string // containerd-shim-cryo-v2, cryoctl ($CRYO_BIN, <repo>/_output/bin)
	GuestDir string // vmlinuz, initrd.img ($CRYO_GUEST_DIR, <repo>/_output/guest)
	Tools    string // containerd, ctr, versitygw under bin/ ($CRYO_TOOLS, /var/cache/cryo/tools)
	// Prefix names the temporary directory (default "cryo-it-") and the
	// state root below /run.
	Prefix    string
	Namespace string // containerd namespace (default "cryo-test")
	// Configure changes the cryo config before containerd starts.
	Configure []func(*configs.Config)
	// ContainerdConfig, when set, writes containerd's config instead of the
	// default one (CRI enabled, for example); scratch is the blockfile
	// snapshotter's scratch file.
	ContainerdConfig func(s *Stack, scratch string) (string, error)
	// NetNS, when set, is the network namespace containerd runs in.
	NetNS string
	// ShimSocketDir, when set, is the shim manager's socket_dir instead of
	// one under the stack's directory. Tests that find a shim's socket
	// themselves (containerd's CRI suite) look in containerd's default,
	// /run/containerd/s; the socket names hash containerd's address, so
	// stacks sharing the directory never clash.
	ShimSocketDir string
	// Watchdog, when set, arms the shims' watchdog: a task API call that
	// runs longer is logged as stuck with the shim's goroutine dump
	// (StuckCalls finds it).
	Watchdog time.Duration
}

// Stack is one private containerd with the cryo runtime.
type Stack struct {
	Dir        string // everything on disk
	Socket     string
	Namespace  string
	ConfigPath string // cryo's config.toml
	StateRoot  string // cryo's runtime.state_root
	// ShimSocketDir is where the shims' sockets are (Options.ShimSocketDir,
	// else <Dir>/s).
	ShimSocketDir string
	// MemoryDir is hypervisor.memory_dir, one per Stack under /dev/shm, so
	// that Close removes every RAM file the Stack's sandboxes left (the shim
	// names them by a hash of their state dir, which no two stacks share).
	MemoryDir string
	FIFODir   string // the task I/O FIFOs of the Stack's ctr commands (ctrArgs)
	Cfg       configs.Config
	LogPath   string
	Tools     string

	ctx  context.Context // parent of every command the stack runs
	cmd  *exec.Cmd
	path string // PATH for containerd and ctr
}

// RepoRoot finds the repository root above the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("no go.mod above %s: set CRYO_BIN and CRYO_GUEST_DIR", dir)
}

func fromRepo(env string, sub ...string) (string, error) {
	if d := os.Getenv(env); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(append([]string{root}, sub...)...), nil
}

// GuestDir returns the guest image directory (vmlinuz, initrd.img): dir,
// else $CRYO_GUEST_DIR, else <repo>/_output/guest.
func GuestDir(dir string) (string, error) {
	var err error
	if dir == "" {
		if dir, err = fromRepo("CRYO_GUEST_DIR", "_output", "guest"); err != nil {
			return "", err
		}
	}
	for _, f := range []string{"vmlinuz", "initrd.img"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("guest image file %s missing: run `make guest` (or set CRYO_GUEST_DIR)", filepath.Join(dir, f))
		}
	}
	return dir, nil
}

// BinDir returns the directory with containerd-shim-cryo-v2 and cryoctl:
// dir, else $CRYO_BIN, else <repo>/_output/bin.
func BinDir(dir string) (string, error) {
	var err error
	if dir == "" {
		if dir, err = fromRepo("CRYO_BIN", "_output", "bin"); err != nil {
			return "", err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "containerd-shim-cryo-v2")); err != nil {
		return "", fmt.Errorf("containerd-shim-cryo-v2 not in %s: run `make binaries` (or set CRYO_BIN)", dir)
	}
	return dir, nil
}

// ToolsDir returns dir, else $CRYO_TOOLS, else /var/cache/cryo/tools.
func ToolsDir(dir string) string {
	if dir == "" {
		dir = os.Getenv("CRYO_TOOLS")
	}
	if dir == "" {
		dir = "/var/cache/cryo/tools"
	}
	return dir
}

// Need returns an error unless the named binaries are on path, telling
// what to install.
func Need(path string, bins ...string) error {
	for _, b := range bins {
		if _, err := LookPath(b, path); err != nil {
			return fmt.Errorf("%s not found on PATH: run `make deps` (hack/deps.sh) to install it", b)
		}
	}
	return nil
}

// LookPath finds bin in the directories of path.
func LookPath(bin, path string) (string, error) {
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, bin)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", bin, os.ErrNotExist)
}

// Start starts a private containerd configured with the cryo runtime. ctx
// bounds every command the Stack runs later (Close does not use it). On
// error nothing is left behind.
func Start(ctx context.Context, o Options) (_ *Stack, retErr error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the stack starts containerd and QEMU and must run as root")
	}
	if o.Prefix == "" {
		o.Prefix = "cryo-it-"
	}
	if o.Namespace == "" {
		o.Namespace = "cryo-test"
	}
	bin, err := BinDir(o.BinDir)
	if err != nil {
		return nil, err
	}
	guest, err := GuestDir(o.GuestDir)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", o.Prefix)
	if err != nil {
		return nil, err
	}
	s := &Stack{
		ctx: ctx, Dir: dir, Namespace: o.Namespace, Tools: ToolsDir(o.Tools),
		Socket:    filepath.Join(dir, "c.sock"),
		StateRoot: "/run/" + strings.TrimSuffix(o.Prefix, "-") + "/" + filepath.Base(dir)[len(o.Prefix):],
		LogPath:   filepath.Join(dir, "containerd.log"),
		MemoryDir: "/dev/shm/" + filepath.Base(dir),
		FIFODir:   filepath.Join(dir, "fifo"),

		ShimSocketDir: o.ShimSocketDir,
	}
	if s.ShimSocketDir == "" {
		s.ShimSocketDir = filepath.Join(dir, "s")
	}
	s.path = bin + ":" + filepath.Join(s.Tools, "bin") + ":" + os.Getenv("PATH")
	defer func() {
		if retErr != nil {
			_ = s.Close()
		}
	}()
	if err := Need(s.path, "containerd", "ctr", "qemu-system-x86_64", "qemu-img", "mkfs.ext4"); err != nil {
		return nil, err
	}

	if err := s.writeConfig(guest, o.Configure); err != nil {
		return nil, err
	}
	if err := s.startContainerd(ctx, o); err != nil {
		return nil, err
	}
	if err := s.importImage(); err != nil {
		return nil, err
	}
	return s, nil
}

// writeConfig writes the node's cryo config: the guest files, the stack's
// directories, and what o's Configure changes.
func (s *Stack) writeConfig(guest string, configure []func(*configs.Config)) error {
	dir := s.Dir
	s.Cfg = configs.Default()
	s.Cfg.Hypervisor.Kernel = filepath.Join(guest, "vmlinuz")
	s.Cfg.Hypervisor.Initrd = filepath.Join(guest, "initrd.img")
	s.Cfg.Runtime.StateRoot = s.StateRoot
	s.Cfg.Runtime.ImageCache = filepath.Join(dir, "images")
	s.Cfg.Runtime.WritableDiskMiB = 256
	s.Cfg.Snapshot.CacheDir = filepath.Join(dir, "cache")
	s.Cfg.Runtime.DiskRoot = filepath.Join(dir, "disks")
	s.Cfg.Snapshot.LocalRoot = filepath.Join(dir, "store")
	s.Cfg.Stores.Allowed = []string{"file://" + filepath.Join(dir, "store") + "/"}
	s.Cfg.Hypervisor.MemoryMiB = 256
	s.Cfg.Hypervisor.MemoryDir = s.MemoryDir
	if err := os.MkdirAll(s.MemoryDir, 0o700); err != nil {
		return err
	}
	for _, f := range configure {
		f(&s.Cfg)
	}
	s.ConfigPath = filepath.Join(dir, "cryo.toml")
	return s.WriteConfig(s.ConfigPath, s.Cfg)
}

// startContainerd starts containerd on a scratch blockfile snapshotter and
// waits until it answers.
func (s *Stack) startContainerd(ctx context.Context, o Options) error {
	dir := s.Dir
	scratch := filepath.Join(dir, "scratch.ext4")
	if err := os.WriteFile(scratch, nil, 0o600); err != nil {
		return err
	}
	if err := os.Truncate(scratch, 256<<20); err != nil {
		return err
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", scratch).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs scratch: %w: %s", err, out)
	}
	cfg := s.ContainerdConfig(scratch, criPlugins...)
	if o.ContainerdConfig != nil {
		var err error
		if cfg, err = o.ContainerdConfig(s, scratch); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "containerd.toml"), []byte(cfg), 0o600); err != nil {
		return err
	}
	logf, err := os.Create(s.LogPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	s.cmd = exec.Command(s.Bin("containerd"), "--config", filepath.Join(dir, "containerd.toml"))
	if o.NetNS != "" {
		s.cmd = exec.Command("nsenter", "--net="+o.NetNS, s.Bin("containerd"), "--config", filepath.Join(dir, "containerd.toml"))
	}
	// containerd's own temporary files (a task created from a checkpoint
	// image leaves ctrd-checkpoint* behind) go with the stack.
	tmp := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	s.cmd.Env = append(os.Environ(), "PATH="+s.path, "TMPDIR="+tmp)
	if o.Watchdog > 0 {
		s.cmd.Env = append(s.cmd.Env, watchdog.Env+"="+o.Watchdog.String())
	}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return fmt.Errorf("start containerd: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, _, err := s.ctr(ctx, 10*time.Second, "version"); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd did not come up:\n%s", s.LogTail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// importImage imports the test image into both snapshotters.
func (s *Stack) importImage() error {
	img := filepath.Join(s.Dir, "busybox.tar")
	if err := busybox.WriteFile(img, Image, []string{"/bin/sh"}); err != nil {
		return err
	}
	for _, sn := range []string{"overlayfs", "blockfile"} {
		if _, err := s.CtrOK("image", "import", "--snapshotter", sn, img); err != nil {
			return err
		}
	}
	return nil
}

// Bin resolves a binary on the Stack's PATH (exec.Command would search the
// calling process's PATH instead).
func (s *Stack) Bin(name string) string {
	if p, err := LookPath(name, s.path); err == nil {
		return p
	}
	return name
}

// Path is the PATH the Stack runs containerd, ctr and cryoctl with.
func (s *Stack) Path() string { return s.path }

// WriteConfig writes a cryo config file.
func (s *Stack) WriteConfig(path string, c configs.Config) error {
	b, err := toml.Marshal(c)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Ctr runs ctr against the private containerd with a 2 minute deadline.
func (s *Stack) Ctr(args ...string) (stdout, stderr string, err error) {
	return s.ctr(s.ctx, 2*time.Minute, args...)
}

// CtrOK runs ctr and turns a failure into an error with ctr's output and
// the tail of containerd's log.
func (s *Stack) CtrOK(args ...string) (string, error) {
	out, errs, err := s.Ctr(args...)
	if err != nil && s.ctx.Err() != nil {
		return out, fmt.Errorf("ctr %s: %w", args[0], s.ctx.Err())
	}
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w\nstdout: %s\nstderr: %s\ncontainerd log:\n%s", strings.Join(args, " "), err, out, errs, s.LogTail(30))
	}
	return out, nil
}

func (s *Stack) ctr(parent context.Context, timeout time.Duration, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.Bin("ctr"), append([]string{"-a", s.Socket, "-n", s.Namespace}, ctrArgs(s.FIFODir, args)...)...)
	cmd.Env = append(os.Environ(), "PATH="+s.path)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		if parent.Err() != nil {
			err = fmt.Errorf("ctr %s: %w", strings.Join(args, " "), parent.Err())
		} else {
			err = fmt.Errorf("ctr %s: timed out after %s", strings.Join(args, " "), timeout)
		}
	}
	return out.String(), errb.String(), err
}

// ctrArgs adds --fifo-dir fifoDir to the ctr commands that make a task's
// I/O FIFOs (run, task start, task exec). Without it they go to the host's
// /run/containerd/fifo, and ctr removes them only when it waits for the
// process or deletes a task whose shim still answers: a detached exec's,
// or those of a task whose shim was killed, stayed there for good. Under
// the Stack's directory they go with it. `ctr container restore` has no
// such flag; `ctr task rm` of the restored task removes its FIFOs.
func ctrArgs(fifoDir string, args []string) []string {
	at := 0
	switch {
	case len(args) > 0 && args[0] == "run":
		at = 1
	case len(args) > 1 && slices.Contains([]string{"task", "tasks", "t"}, args[0]) && slices.Contains([]string{"start", "exec"}, args[1]):
		at = 2
	default:
		return args
	}
	for _, a := range args[at:] {
		if a == "--fifo-dir" || strings.HasPrefix(a, "--fifo-dir=") || a == "--log-uri" || strings.HasPrefix(a, "--log-uri=") {
			return args // the caller's own choice (ctr refuses both together)
		}
	}
	return slices.Concat(args[:at], []string{"--fifo-dir", fifoDir}, args[at:])
}

// CtrTTY runs ctr at a terminal (AtTerminal), as a user would: `ctr ... -t`
// needs one.
func (s *Stack) CtrTTY(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.Command("ctr", append([]string{"-a", s.Socket, "-n", s.Namespace}, ctrArgs(s.FIFODir, args)...)...)
	cmd.Env = append(os.Environ(), "PATH="+s.path)
	out, err := AtTerminal(ctx, cmd).CombinedOutput()
	return string(out), err
}

// Cryoctl runs cryoctl with this Stack's cryo config.
func (s *Stack) Cryoctl(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(s.ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.Bin("cryoctl"), append([]string{"--config", s.ConfigPath}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+s.path)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// StoreURL is a file:// store reference under this Stack's allowed store root.
func (s *Stack) StoreURL(name string) string { return "file://" + filepath.Join(s.Dir, "store", name) }

// RunArgs returns `ctr run` arguments for the cryo runtime with this
// Stack's config.
func (s *Stack) RunArgs(extra ...string) []string {
	return append([]string{"run", "--runtime", configs.RuntimeType, "--runtime-config-path", s.ConfigPath}, extra...)
}

// ExitCode returns the exit code of a ctr error.
func ExitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

// LogTail returns the last n lines of containerd's log (the shims log there).
func (s *Stack) LogTail(n int) string {
	b, _ := os.ReadFile(s.LogPath)
	return LastLines(string(b), n)
}

// LastLines is the last n lines of s.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// QEMUPids returns the QEMU processes started under this Stack's state root.
func (s *Stack) QEMUPids() []int { return ProcsMatching("qemu-system", s.StateRoot) }

// ShimPids returns the cryo shim processes serving this Stack's containerd.
func (s *Stack) ShimPids() []int { return ProcsMatching("containerd-shim-cryo-v2", s.Socket) }

// WaitFor polls cond until it is true or timeout passes.
func WaitFor(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// StuckCalls returns what the shims' watchdog reported in containerd's log:
// each stuck call's log line and the goroutine dump its shim wrote after it.
func (s *Stack) StuckCalls() []string {
	b, err := os.ReadFile(s.LogPath)
	if err != nil {
		return nil
	}
	var found []string
	text := string(b)
	for {
		i := strings.Index(text, watchdog.StuckMessage)
		if i < 0 {
			return found
		}
		start := strings.LastIndexByte(text[:i], '\n') + 1
		report := text[start:]
		end := strings.Index(report, watchdog.DumpEnd)
		if end < 0 {
			end = min(len(report), 64<<10)
		} else {
			end += len(watchdog.DumpEnd)
		}
		found = append(found, report[:end])
		text = report[end:]
	}
}
