package guest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// pseudoMounts are the guest's own filesystems, in order.
var pseudoMounts = []struct {
	src, dst, fstype string
	flags            uintptr
	data             string
}{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "nsdelegate"},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "ptmxmode=0666,mode=0620,gid=5"},
	{"shm", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
}

// Boot prepares the guest as its PID 1: /dev and the console, pseudo
// filesystems, kernel modules (modulesList: one .ko path per line, in load
// order), cgroup controllers and the loopback interface.
func Boot(ctx context.Context, modulesList string) error {
	if err := mountOnce("devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
		return err
	}
	if c, err := os.OpenFile("/dev/console", os.O_RDWR, 0); err == nil {
		for fd := 0; fd < 3; fd++ {
			unix.Dup2(int(c.Fd()), fd)
		}
		c.Close()
	}
	for _, m := range pseudoMounts {
		if err := mountOnce(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
			return err
		}
	}
	// Containers' mount namespaces are slaves of /run: when the agent unmounts
	// a container's disk there, the unmount reaches their copies too.
	if err := unix.Mount("", "/run", "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make /run shared: %w", err)
	}
	t := time.Now()
	if err := loadModules(ctx, modulesList); err != nil {
		return err
	}
	log.G(ctx).WithField("took", time.Since(t)).Debug("modules loaded")
	if err := enableControllers("/sys/fs/cgroup", "cryo"); err != nil {
		return err
	}
	return setLinkUp("lo")
}

func mountOnce(src, dst, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil && err != unix.EBUSY {
		return fmt.Errorf("mount %s on %s: %w", fstype, dst, err)
	}
	return nil
}

// loadModules loads each module listed in path (missing list: nothing to do).
func loadModules(ctx context.Context, path string) error {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, p := range strings.Fields(string(b)) {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("load module: %w", err)
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && err != unix.EEXIST {
			return fmt.Errorf("load module %s: %w", p, err)
		}
	}
	return nil
}

// enableControllers turns on every available controller for the children of
// root and of root/group (the parent of all container cgroups).
func enableControllers(root, group string) error {
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return err
	}
	var on []string
	for _, c := range strings.Fields(string(b)) {
		on = append(on, "+"+c)
	}
	if err := os.MkdirAll(filepath.Join(root, group), 0o755); err != nil {
		return err
	}
	for _, dir := range []string{root, filepath.Join(root, group)} {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(on, " ")), 0); err != nil {
			return fmt.Errorf("enable cgroup controllers in %s: %w", dir, err)
		}
	}
	return nil
}

func setLinkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get flags of %s: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring %s up: %w", name, err)
	}
	return nil
}

// FindPort waits for the virtio-serial port called name and returns its
// device: devtmpfs only creates /dev/vportNpM, the name is in sysfs.
func FindPort(ctx context.Context, sysClass, name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		ms, _ := filepath.Glob(filepath.Join(sysClass, "*", "name"))
		for _, m := range ms {
			if b, err := os.ReadFile(m); err == nil && strings.TrimSpace(string(b)) == name {
				return "/dev/" + filepath.Base(filepath.Dir(m)), nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port %q after %v", name, timeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
