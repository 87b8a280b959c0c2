package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HelperArg, as os.Args[1], makes the agent binary run as a container helper
// (see RunHelper) instead of the guest's PID 1.
const HelperArg = "container-helper"

// File descriptors of the helper (0-2 are the process's stdio).
const (
	fdConfig = 3 // helperConfig JSON, read to EOF
	fdStatus = 4 // helper -> agent: statusMsg lines; closed by execve
	fdStart  = 5 // init: one byte from the agent starts the process
	// init: the namespaces to join (helperConfig.Join), in order
	fdJoin = 6
	// exec: namespace files of the container's init, and its root directory
	fdMntNS = 5
	fdUTSNS = 6
	fdIPCNS = 7
	fdRoot  = 8
)

type statusMsg struct {
	Ready bool   `json:"ready,omitempty"`
	Error string `json:"error,omitempty"`
}

// RunHelper is the helper's main: it sets the container up (init) or enters a
// running one (exec), then becomes the container's process with execve. Go
// cannot enter a mount namespace from a multithreaded process, except on a
// thread that has its own filesystem context (unshare(CLONE_FS)); so everything
// happens on one locked thread, which is the one that calls execve: namespaces,
// credentials, capabilities and no_new_privs are all per thread.
func RunHelper() {
	runtime.LockOSThread()
	for fd := fdConfig; fd <= fdRoot; fd++ {
		unix.CloseOnExec(fd)
	}
	status := os.NewFile(fdStatus, "status")
	err := runHelper(status)
	msg, _ := json.Marshal(statusMsg{Error: err.Error()})
	status.Write(append(msg, '\n'))
	os.Exit(127)
}

func runHelper(status *os.File) error {
	var cfg helperConfig
	cf := os.NewFile(fdConfig, "config")
	if err := json.NewDecoder(cf).Decode(&cfg); err != nil {
		return fmt.Errorf("read helper config: %w", err)
	}
	cf.Close()
	p := cfg.Process
	if p.OOMScoreAdj != nil {
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(*p.OOMScoreAdj)), 0); err != nil {
			return fmt.Errorf("set oom_score_adj: %w", err)
		}
	}
	switch cfg.Mode {
	case helperInit:
		if err := joinNamespaces(cfg.Join); err != nil {
			return err
		}
		if err := setupContainer(&cfg); err != nil {
			return err
		}
		// As runc: a process that cannot start fails the create, not the
		// start, which would leave a created container behind.
		if err := checkStartable(&p); err != nil {
			return err
		}
		msg, _ := json.Marshal(statusMsg{Ready: true})
		if _, err := status.Write(append(msg, '\n')); err != nil {
			return err
		}
		start := os.NewFile(fdStart, "start")
		if n, _ := start.Read(make([]byte, 1)); n != 1 {
			os.Exit(1) // the agent went away or removed the container before start
		}
		start.Close()
	case helperExec:
		if err := enterContainer(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown helper mode %q", cfg.Mode)
	}
	return execProcess(&p)
}

// setupContainer runs in the new mount, pid, uts and ipc namespaces of a new
// container: mounts, devices, files, then the root is moved onto / and
// chrooted into. pivot_root is not possible: the guest root is the initramfs.
func setupContainer(cfg *helperConfig) error {
	// slave, not private: unmounts of other containers' disks by the agent
	// propagate into this namespace, so their devices do not stay busy.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / rslave: %w", err)
	}
	root := cfg.Rootfs
	stage, err := stageCopies(cfg.Mounts)
	if err != nil {
		return err
	}
	defer stage.release()
	for i, m := range cfg.Mounts {
		if err := mountInto(root, m, stage.path(i)); err != nil {
			return err
		}
	}
	// Flags of copied mounts are applied once all mounts exist: a mount
	// point inside a read-only copy could not be made afterwards.
	for _, m := range cfg.Mounts {
		if err := applyCopyFlags(root, m); err != nil {
			return err
		}
	}
	stage.release()
	for _, d := range cfg.Devices {
		if err := makeDevice(root, d); err != nil {
			return err
		}
	}
	for _, l := range [][2]string{{"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"}, {"/proc/self/fd/1", "/dev/stdout"}, {"/proc/self/fd/2", "/dev/stderr"}, {"pts/ptmx", "/dev/ptmx"}} {
		if dst, err := securePath(root, l[1]); err == nil {
			os.Symlink(l[0], dst) // best effort: the image may have its own
		}
	}
	for _, f := range cfg.Files {
		if err := writeFileInto(root, f); err != nil {
			return err
		}
	}
	for _, p := range cfg.MaskedPaths {
		if err := maskPath(root, p); err != nil {
			return err
		}
	}
	for _, p := range cfg.ReadonlyPaths {
		if err := readonlyPath(root, p); err != nil {
			return err
		}
	}
	// like runc: a missing working directory is created
	if cwd, err := securePath(root, cfg.Process.Cwd); err == nil {
		os.MkdirAll(cwd, 0o755)
	}
	if cfg.ReadonlyRoot {
		if err := unix.Mount("", root, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount root read-only: %w", err)
		}
	}
	// A joined UTS namespace has the pod's names already, which another
	// container may have changed since.
	if !slices.Contains(cfg.Join, "uts") {
		if err := setNames(cfg.Hostname, cfg.Domainname); err != nil {
			return err
		}
	}
	if err := writeSysctls(cfg.Sysctl); err != nil {
		return err
	}
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(root, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// joinNamespaces enters, on this thread, the namespaces at fdJoin on.
func joinNamespaces(join []string) error {
	for i, ns := range join {
		if err := unix.Setns(fdJoin+i, int(joinable[ns])); err != nil {
			return fmt.Errorf("join the pod's %s namespace: %w", ns, err)
		}
	}
	return nil
}

func setNames(hostname, domainname string) error {
	if hostname != "" {
		if err := unix.Sethostname([]byte(hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	if domainname != "" {
		if err := unix.Setdomainname([]byte(domainname)); err != nil {
			return fmt.Errorf("set domainname: %w", err)
		}
	}
	return nil
}

// writeSysctls writes the container's sysctls through the guest's /proc,
// from inside its namespaces: a namespaced sysctl (kernel.shm*, fs.mqueue.*,
// net.*) is the namespace's, which this thread is in. A name the guest
// kernel does not have fails the container, as under runc.
func writeSysctls(sysctl map[string]string) error {
	for p, v := range sysctl {
		f, err := os.OpenFile(filepath.Join("/proc/sys", p), os.O_WRONLY|unix.O_NOFOLLOW, 0)
		if err == nil {
			_, err = f.WriteString(v)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return fmt.Errorf("linux.sysctl: write %q to /proc/sys/%s: %w", v, p, err)
		}
	}
	return nil
}

// mountInto makes m inside root; staged is where a read-only copied mount's
// content was staged.
func mountInto(root string, m mountEntry, staged string) error {
	dst, err := securePath(root, m.Target)
	if err != nil {
		return err
	}
	if m.Copy != nil {
		return mountCopy(dst, m, staged)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("mount %s: %w", m.Target, err)
	}
	if m.PodShm {
		if !path.IsAbs(m.Source) {
			return fmt.Errorf("mount %s: the pod's shared memory was not made", m.Target)
		}
		return bindWithOptions(m.Source, dst, m, "the pod's shared memory")
	}
	if m.FSType == "devpts" {
		// The agent allocates terminals from the guest's devpts instance
		// before the process enters the container, so the container sees
		// that instance: a new one would not hold its /dev/pts/N, and
		// ttyname() would fail. The VM, not the devpts instance, is the
		// isolation boundary.
		return bindWithOptions("/dev/pts", dst, m, "devpts")
	}
	if err := unix.Mount(m.Source, dst, m.FSType, m.Flags, m.Data); err != nil {
		return fmt.Errorf("mount %s (%s): %w", m.Target, m.FSType, err)
	}
	return nil
}

// bindWithOptions bind-mounts src at dst, then applies m's per-mount
// options with a bind remount: a bind mount takes them from there, not
// from the bind. what names the mount's kind in errors.
func bindWithOptions(src, dst string, m mountEntry, what string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mount %s (%s): %w", m.Target, what, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|m.Flags&bindRemountFlags, ""); err != nil {
		return fmt.Errorf("mount %s (%s): apply options: %w", m.Target, what, err)
	}
	return nil
}

func makeDevice(root string, d deviceEntry) error {
	dst, err := securePath(root, d.Path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	mode := d.Mode & 0o7777
	switch d.Type {
	case "c", "u":
		mode |= unix.S_IFCHR
	case "b":
		mode |= unix.S_IFBLK
	case "p":
		mode |= unix.S_IFIFO
	default:
		return fmt.Errorf("device %s: unknown type %q", d.Path, d.Type)
	}
	os.Remove(dst)
	if err := unix.Mknod(dst, mode, int(unix.Mkdev(uint32(d.Major), uint32(d.Minor)))); err != nil {
		return fmt.Errorf("mknod %s: %w", d.Path, err)
	}
	unix.Chmod(dst, d.Mode&0o7777) // mknod applies the umask
	return os.Lchown(dst, int(d.UID), int(d.GID))
}

func writeFileInto(root string, f fileEntry) error {
	dst, err := securePath(root, f.Path)
	if err != nil {
		return err
	}
	return writeFileAt(dst, f)
}

// writeFileAt writes f's content at dst (f.Path names it in errors), with
// its mode (0644 when zero) and owner.
func writeFileAt(dst string, f fileEntry) error {
	if f.Mode&0o7777 == 0 {
		f.Mode = 0o644
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("copy %s: %w", f.Path, err)
	}
	if err := os.WriteFile(dst, f.Content, 0o600); err != nil {
		return fmt.Errorf("copy %s: %w", f.Path, err)
	}
	if err := setModeOwner(dst, f); err != nil {
		return fmt.Errorf("copy %s: %w", f.Path, err)
	}
	return nil
}

// setModeOwner gives dst f's owner, then its mode (chown clears setuid
// and setgid bits).
func setModeOwner(dst string, f fileEntry) error {
	if err := os.Lchown(dst, int(f.UID), int(f.GID)); err != nil {
		return err
	}
	return unix.Chmod(dst, f.Mode&0o7777)
}

func maskPath(root, p string) error {
	dst, err := securePath(root, p)
	if err != nil {
		return err
	}
	fi, err := os.Stat(dst)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		err = unix.Mount("tmpfs", dst, "tmpfs", unix.MS_RDONLY, "")
	} else {
		err = unix.Mount("/dev/null", dst, "", unix.MS_BIND, "")
	}
	if err != nil {
		return fmt.Errorf("mask %s: %w", p, err)
	}
	return nil
}

func readonlyPath(root, p string) error {
	dst, err := securePath(root, p)
	if err != nil {
		return err
	}
	if err := unix.Mount(dst, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("readonly %s: %w", p, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("readonly %s: %w", p, err)
	}
	return nil
}

// enterContainer joins the mount, uts and ipc namespaces and the root of a
// running container on this thread (the pid namespace and cgroup were set by
// the agent when it started this process).
func enterContainer() error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare fs: %w", err)
	}
	for _, ns := range []struct {
		fd   int
		kind int
	}{{fdUTSNS, unix.CLONE_NEWUTS}, {fdIPCNS, unix.CLONE_NEWIPC}, {fdMntNS, unix.CLONE_NEWNS}} {
		if err := unix.Setns(ns.fd, ns.kind); err != nil {
			return fmt.Errorf("setns %#x: %w", ns.kind, err)
		}
	}
	if err := unix.Fchdir(fdRoot); err != nil {
		return fmt.Errorf("enter container root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return nil
}

// defaultRlimits are a container process's limits where its spec sets
// none: those runc's containers inherit from containerd under its packaged
// systemd unit (CRI sends no rlimits), NOFILE 1024:524288 (systemd's
// default) and NPROC and CORE unlimited. The guest kernel's own (NOFILE
// 1024:4096, no core, NPROC half a small VM's threads) would stop a server
// that raises its soft NOFILE to the hard one at 4096 connections.
var defaultRlimits = []rlimit{
	{Resource: unix.RLIMIT_NOFILE, Soft: 1024, Hard: 524288},
	{Resource: unix.RLIMIT_NPROC, Soft: unix.RLIM_INFINITY, Hard: unix.RLIM_INFINITY},
	{Resource: unix.RLIMIT_CORE, Soft: unix.RLIM_INFINITY, Hard: unix.RLIM_INFINITY},
}

// checkStartable finds, in the container's root, the process's executable
// and its working directory.
func checkStartable(p *processConfig) error {
	name := p.Args[0]
	if !strings.Contains(name, "/") {
		if _, err := lookPath(name, p.Env); err != nil {
			return err
		}
	} else if fi, err := os.Stat(inDir(p.Cwd, name)); err != nil {
		return fmt.Errorf("exec %s: %w", name, err)
	} else if fi.IsDir() {
		return fmt.Errorf("exec %s: is a directory", name)
	}
	if fi, err := os.Stat(p.Cwd); err != nil {
		return fmt.Errorf("working directory %s: %w", p.Cwd, err)
	} else if !fi.IsDir() {
		return fmt.Errorf("working directory %s: not a directory", p.Cwd)
	}
	return nil
}

// inDir is name as seen from dir: itself when absolute.
func inDir(dir, name string) string {
	if path.IsAbs(name) {
		return name
	}
	return path.Join(dir, name)
}

// execProcess applies the process's limits and credentials on this thread and
// executes it.
func execProcess(p *processConfig) error {
	for _, r := range append(slices.Clone(defaultRlimits), p.Rlimits...) {
		// syscall.Setrlimit, not unix: Go restores its own RLIMIT_NOFILE on
		// exec unless it was set through package syscall.
		if err := syscall.Setrlimit(r.Resource, &syscall.Rlimit{Cur: r.Soft, Max: r.Hard}); err != nil {
			return fmt.Errorf("setrlimit %d: %w", r.Resource, err)
		}
	}
	if p.Umask != nil {
		unix.Umask(int(*p.Umask))
	}
	if p.Capabilities != nil {
		if err := dropBounding(p.Capabilities); err != nil {
			return err
		}
		if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("keepcaps: %w", err)
		}
	}
	if err := setCredentials(p); err != nil {
		return err
	}
	if p.Capabilities != nil {
		if err := applyCaps(p.Capabilities); err != nil {
			return err
		}
	}
	if p.NoNewPrivileges {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("no_new_privs: %w", err)
		}
	}
	if err := unix.Chdir(p.Cwd); err != nil {
		return fmt.Errorf("chdir %s: %w", p.Cwd, err)
	}
	env := p.Env
	if !hasEnv(env, "HOME") {
		env = append(env, "HOME="+homeDir("/etc/passwd", p.UID))
	}
	bin, err := lookPath(p.Args[0], env)
	if err != nil {
		return err
	}
	if err := unix.Exec(bin, p.Args, env); err != nil {
		return fmt.Errorf("exec %s: %w", p.Args[0], err)
	}
	return nil
}

// setCredentials changes groups, gid and uid of this thread only (raw
// syscalls: Go's Setuid would change every thread; only this one execs).
func setCredentials(p *processConfig) error {
	gids := p.AdditionalGids
	var gp unsafe.Pointer
	if len(gids) > 0 {
		gp = unsafe.Pointer(&gids[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gids)), uintptr(gp), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(p.GID), uintptr(p.GID), uintptr(p.GID)); e != 0 {
		return fmt.Errorf("setgid %d: %w", p.GID, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(p.UID), uintptr(p.UID), uintptr(p.UID)); e != 0 {
		return fmt.Errorf("setuid %d: %w", p.UID, e)
	}
	return nil
}

// homeDir looks uid up in the container's passwd file, like runc does when
// the spec sets no HOME; "/" when it is not there.
func homeDir(passwd string, uid uint32) string {
	b, err := os.ReadFile(passwd)
	if err != nil {
		return "/"
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 6 && f[2] == strconv.FormatUint(uint64(uid), 10) && f[5] != "" {
			return f[5]
		}
	}
	return "/"
}

// lookPath finds name in the PATH of env, in the container's root.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	pathEnv := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			pathEnv = v
		}
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := path.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec %s: executable file not found in $PATH", name)
}
