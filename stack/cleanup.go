package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Close removes what is left through containerd (so shims clean up), stops
// containerd, kills any QEMU or shim process of this Stack that is still
// there, unmounts and removes its files. It returns an error naming the
// processes it had to kill: a leak the caller should report. Close does not
// use the context Start was given, so it also works after a Ctrl-C.
func (s *Stack) Close() error {
	bg := context.Background()
	if s.cmd != nil && s.cmd.Process != nil {
		if out, _, err := s.ctr(bg, 20*time.Second, "task", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				_, _, _ = s.ctr(bg, 20*time.Second, "task", "rm", "-f", id)
			}
		}
		if out, _, err := s.ctr(bg, 20*time.Second, "c", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				_, _, _ = s.ctr(bg, 20*time.Second, "c", "rm", id)
			}
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-done
		}
		s.cmd = nil
	}
	// A shim ends a moment after containerd's delete returns (its shutdown
	// unmounts and tears the network down first), longer under load: a
	// process is a leak only if it is still there after that.
	left := func() []int {
		pids := append(s.QEMUPids(), s.ShimPids()...)
		return append(pids, ProcsMatching("containerd-shim-runc-v2", s.Socket)...)
	}
	WaitFor(10*time.Second, func() bool { return len(left()) == 0 })
	leaked := left()
	for _, pid := range leaked {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if pids := removeCgroups(s.CgroupRoot()); len(pids) > 0 {
		leaked = append(leaked, pids...)
	}
	unmountUnder(s.Dir)
	_ = os.RemoveAll(s.StateRoot)
	_ = os.Remove(filepath.Dir(s.StateRoot)) // shared by stacks: only when empty
	if s.MemoryDir != "" {
		_ = os.RemoveAll(s.MemoryDir)
	}
	_ = os.RemoveAll(s.Dir)
	if len(leaked) > 0 {
		return fmt.Errorf("leaked processes (killed): %v", leaked)
	}
	return nil
}

// CgroupRoot is the cgroup (below every v1 hierarchy's root) that a
// kubelet on this Stack puts its pods in (K8sOptions.CgroupRoot): runc's
// containers live there, and Close removes it.
func (s *Stack) CgroupRoot() string { return "/" + filepath.Base(s.Dir) }

// cgroupFS is where the cgroup hierarchies are mounted.
const cgroupFS = "/sys/fs/cgroup"

// removeCgroups kills the processes left in root's cgroups (in every
// hierarchy) and removes them, deepest first. It returns the pids it
// killed.
func removeCgroups(root string) []int {
	var dirs []string
	var pids []int
	hier, _ := os.ReadDir(cgroupFS)
	for _, h := range hier {
		_ = filepath.WalkDir(filepath.Join(cgroupFS, h.Name(), root), func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			dirs = append(dirs, p)
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		// A killed process leaves its cgroup a moment later.
		WaitFor(5*time.Second, func() bool {
			err := syscall.Rmdir(dirs[i])
			return err == nil || errors.Is(err, os.ErrNotExist)
		})
	}
	return pids
}

// ProcsMatching returns the pids whose command line contains both name and
// arg.
func ProcsMatching(name, arg string) []int {
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

// criPlugins are disabled in a stack without CRI: ctr needs none of them.
var criPlugins = []string{"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images",
	"io.containerd.nri.v1.nri", "io.containerd.podsandbox.controller.v1.podsandbox", "io.containerd.sandbox.controller.v1.shim"}

// ContainerdConfig returns the stack's containerd config (version 3: private
// root, state, sockets, shim socket dir, blockfile and overlayfs unpacking)
// with the given plugins disabled. Callers may append plugin sections.
func (s *Stack) ContainerdConfig(scratch string, disabled ...string) string {
	q := make([]string, len(disabled))
	for i, d := range disabled {
		q[i] = strconv.Quote(d)
	}
	return fmt.Sprintf(containerdConfig, s.Dir, s.Dir, strings.Join(q, ", "), s.Socket, s.Socket, s.Dir, s.ShimSocketDir, scratch)
}

const containerdConfig = `version = 3
root = "%s/root"
state = "%s/state"
disabled_plugins = [%s]

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
    socket_dir = "%s"
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
