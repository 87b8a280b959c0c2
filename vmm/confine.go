package vmm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// SandboxOptions is QEMU's -sandbox value for a confined machine: its
// seccomp filter, installed before QEMU parses a guest's device state or
// talks to the guest, refuses obsolete system calls, any change of
// credentials, fork/exec and changes of scheduling or resource limits.
const SandboxOptions = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// Defaults of Confinement.
const (
	DefaultUIDBase    = 1_500_000
	DefaultUIDCount   = 4096
	DefaultUIDLockDir = "/run/cryo/qemu-uids"
)

// Confinement says how QEMU is confined. The zero value confines it.
//
// A confined QEMU runs with its seccomp sandbox (SandboxOptions) as an
// unprivileged uid of its own, set before exec: QEMU 7.2 installs its
// seccomp filter before -runas would drop privileges, and
// elevateprivileges=deny then kills it. So QEMU never runs as root, and
// opens nothing by a path it could not open itself: disks, the console and
// the QMP and agent sockets are descriptors the machine opens and passes
// (-add-fd, fd=, QMP add-fd), the kernel, initrd and RAM file are reopened
// through /proc/self/fd.
type Confinement struct {
	// Disabled runs QEMU as root and without its sandbox (debugging only).
	Disabled bool
	// UIDBase and UIDCount are the host uids (used as gids too) QEMUs run
	// as; each machine leases one that no other running machine holds, so
	// one QEMU cannot signal, trace or read another. No passwd entries are
	// needed. Zero means DefaultUIDBase and DefaultUIDCount.
	UIDBase, UIDCount int
	// LockDir holds a lock file per uid, locked for as long as a machine
	// holds the uid; default DefaultUIDLockDir.
	LockDir string
}

func (c Confinement) withDefaults() Confinement {
	if c.UIDBase == 0 {
		c.UIDBase = DefaultUIDBase
	}
	if c.UIDCount == 0 {
		c.UIDCount = DefaultUIDCount
	}
	if c.LockDir == "" {
		c.LockDir = DefaultUIDLockDir
	}
	return c
}

func (c Confinement) validate() error {
	switch {
	case c.Disabled:
		return nil
	case c.UIDBase < 1 || c.UIDCount < 1 || int64(c.UIDBase)+int64(c.UIDCount) > 1<<31:
		return fmt.Errorf("qemu uids %d+%d: want a range of positive uids below 2^31", c.UIDBase, c.UIDCount)
	case !filepath.IsAbs(c.LockDir):
		return fmt.Errorf("qemu uid lock dir %q is not an absolute path", c.LockDir)
	}
	return nil
}

// uidLease is a uid held by this machine: the lock on its file lasts as
// long as the file is open, so a dead shim frees its uid (its QEMU dies with
// it: parent-death signal). The lock file also names the files the holder
// gives the uid (its RAM files), so that whoever takes the uid next gives
// back to root what a dead holder could not: files never change hands
// between uids.
type uidLease struct {
	uid int
	f   *os.File
}

// maxLeaseRecord bounds what a lease's file list may hold.
const maxLeaseRecord = 64 << 10

// leaseUID takes the first free uid of c's range, reclaiming the files its
// previous holder left owned by it.
func leaseUID(c Confinement) (*uidLease, error) {
	if err := os.MkdirAll(c.LockDir, 0o700); err != nil {
		return nil, fmt.Errorf("qemu uid locks: %w", err)
	}
	for i := 0; i < c.UIDCount; i++ {
		uid := c.UIDBase + i
		f, err := os.OpenFile(filepath.Join(c.LockDir, strconv.Itoa(uid)), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("qemu uid lock: %w", err)
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			l := &uidLease{uid: uid, f: f}
			if err := l.reclaim(); err != nil {
				f.Close()
				return nil, err
			}
			return l, nil
		}
		f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("qemu uid lock %d: %w", uid, err)
		}
	}
	return nil, fmt.Errorf("%w: all %d qemu uids from %d are in use", errdefs.ErrResourceExhausted, c.UIDCount, c.UIDBase)
}

// own records paths as the files this holder gives the uid, before it
// chowns them: a holder that dies after the chown leaves them named.
func (l *uidLease) own(paths ...string) error {
	b, err := json.Marshal(paths)
	if err != nil {
		return err
	}
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("qemu uid lock %d: %w", l.uid, err)
	}
	if _, err := l.f.WriteAt(b, 0); err != nil {
		return fmt.Errorf("qemu uid lock %d: %w", l.uid, err)
	}
	return nil
}

// reclaim gives back to root every file the previous holder named that is
// still owned by the uid (not followed through a symlink), then forgets
// the list.
func (l *uidLease) reclaim() error {
	b, err := io.ReadAll(io.LimitReader(io.NewSectionReader(l.f, 0, maxLeaseRecord+1), maxLeaseRecord+1))
	if err != nil {
		return fmt.Errorf("qemu uid lock %d: %w", l.uid, err)
	}
	var paths []string
	if len(b) > 0 && len(b) <= maxLeaseRecord {
		// A torn record (a holder that died writing it) names nothing
		// it had chowned yet.
		json.Unmarshal(b, &paths)
	}
	for _, p := range paths {
		var st unix.Stat_t
		if !filepath.IsAbs(p) || unix.Lstat(p, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != l.uid {
			continue
		}
		if err := unix.Lchown(p, 0, 0); err != nil {
			return fmt.Errorf("qemu uid %d: give %s, left by its previous holder, back to root: %w", l.uid, p, err)
		}
		log.L.WithFields(log.Fields{"uid": l.uid, "path": p}).Info("qemu uid: gave a dead holder's file back to root")
	}
	return l.own()
}

func (l *uidLease) release() {
	if l != nil {
		l.f.Close()
	}
}

// credential is what QEMU runs as: the leased uid and the same gid, no
// supplementary groups but the owner group of /dev/kvm under KVM.
func credential(uid int, accel string) (*syscall.Credential, error) {
	c := &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}
	if accel == "kvm" {
		var st unix.Stat_t
		if err := unix.Stat("/dev/kvm", &st); err != nil {
			return nil, fmt.Errorf("kvm: %w", err)
		}
		c.Groups = append(c.Groups, st.Gid)
	}
	return c, nil
}

// procFD is how QEMU reopens a passed descriptor by path. Linux checks the
// file's own permissions, not those of the directories above it.
func procFD(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// ProcessConfinement reads a process's real uid and seccomp mode (2: a
// filter) from /proc/<pid>/status.
func ProcessConfinement(pid int) (uid, seccomp int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	uid, seccomp = -1, -1
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		switch k {
		case "Uid":
			uid, _ = strconv.Atoi(fields[0])
		case "Seccomp":
			seccomp, _ = strconv.Atoi(fields[0])
		}
	}
	if uid < 0 || seccomp < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status has no Uid or Seccomp line", pid)
	}
	return uid, seccomp, nil
}
