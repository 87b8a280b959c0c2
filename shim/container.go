package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/sandbox"
)

// container is one OCI container inside the sandbox VM.
type container struct {
	id string
	// guestID names the container in the guest: its own id, or, in a
	// sandbox restored from a snapshot, the id it had when checkpointed.
	guestID string
	bundle  string
	spec    *specs.Spec
	disk    sandbox.Disk
	// hotplugged disks are removed from the VM when the container is deleted;
	// the sandbox's first disk goes away with the VM.
	hotplugged bool
	workDir    string // writable overlay and other per-container files
	// seq is the container's place in the order they were added.
	seq uint64
	// sharesPid: its spec named a pid namespace to join (CRI: the pod's,
	// or a debug container's target's); see service.pidNamespace.
	sharesPid bool

	mu    sync.Mutex
	init  *process
	execs map[string]*process
}

func (c *container) process(execID string) (*process, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if execID == "" {
		return c.init, nil
	}
	p, ok := c.execs[execID]
	if !ok {
		return nil, fmt.Errorf("exec %s in container %s: %w", execID, c.id, errdefs.ErrNotFound)
	}
	return p, nil
}

func (c *container) addExec(p *process) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.execs[p.execID]; ok {
		return fmt.Errorf("exec %s in container %s: %w", p.execID, c.id, errdefs.ErrAlreadyExists)
	}
	c.execs[p.execID] = p
	return nil
}

func (c *container) removeExec(execID string) {
	c.mu.Lock()
	delete(c.execs, execID)
	c.mu.Unlock()
}

// runningExecs returns the execs that have not exited.
func (c *container) runningExecs() []*process {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ps []*process
	for _, p := range c.execs {
		if s := p.current(); s == stateRunning || s == statePaused {
			ps = append(ps, p)
		}
	}
	return ps
}

func readSpec(bundle string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse spec: %w", err)
	}
	if s.Process == nil {
		return nil, fmt.Errorf("spec in %s has no process: %w", bundle, errdefs.ErrInvalidArgument)
	}
	return &s, nil
}

// maxCopiedFile bounds the host files copied into the guest for bind mounts.
const maxCopiedFile = 1 << 20

// guestFiles copies the content of the spec's bind mounts of small host
// files (resolv.conf, hosts, hostname, termination-log, secrets) for the
// guest, which cannot see host paths. Bind mounts of directories are copied
// when they hold only small regular files; anything else is dropped from the
// spec with a warning. The copied mounts stay in the spec: the guest agent
// mounts each copy where the bind mount was, with its options (ro, nosuid,
// nodev, noexec).
func guestFiles(ctx context.Context, s *specs.Spec) []sandbox.GuestFile {
	var files []sandbox.GuestFile
	kept := s.Mounts[:0]
	for _, m := range s.Mounts {
		if m.Type != "bind" && !slices.Contains(m.Options, "bind") && !slices.Contains(m.Options, "rbind") || m.Destination == "/dev/shm" {
			// /dev/shm (the pod's shared memory, a host path under CRI)
			// stays: the guest agent turns it into a tmpfs of the VM.
			kept = append(kept, m)
			continue
		}
		fs, err := copyTree(m.Source, m.Destination)
		if err != nil {
			log.G(ctx).WithError(err).WithField("mount", m.Destination).Warn("bind mount cannot reach the guest; skipped")
			continue
		}
		files = append(files, fs...)
		kept = append(kept, m)
	}
	s.Mounts = kept
	return files
}

// copyTree reads the host side of a bind mount for the guest: a regular
// file, or a directory of regular files, at most maxCopiedFile bytes in
// all. It reads nothing outside the mount's own tree: a directory is
// opened as an os.Root, which refuses a symlink that leads out of it but
// follows one that stays inside (Kubernetes secret and configmap volumes
// are made of ..data symlinks). FIFOs, sockets and devices are refused
// without blocking.
func copyTree(src, dst string) ([]sandbox.GuestFile, error) {
	st, err := os.Stat(src)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		b, fi, err := readRegular(src, func(flag int) (*os.File, error) { return os.OpenFile(src, flag, 0) }, maxCopiedFile)
		if err != nil {
			return nil, err
		}
		return []sandbox.GuestFile{guestFile(dst, b, fi)}, nil
	}
	root, err := os.OpenRoot(src)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	var files []sandbox.GuestFile
	left := int64(maxCopiedFile)
	err = fs.WalkDir(root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			// Its mode and owner: a volume made for the pod's user
			// (an emptyDir's 0777, an fsGroup's group) stays its.
			fi, err := root.Stat(p)
			if err != nil {
				return err
			}
			files = append(files, guestFile(path.Join(dst, p), nil, fi))
			return nil
		}
		if e.Type()&fs.ModeSymlink != 0 {
			fi, err := root.Stat(p) // an escape fails here
			if err != nil {
				return fmt.Errorf("%s: %w", filepath.Join(src, p), err)
			}
			if fi.IsDir() {
				return nil
			}
		}
		b, fi, err := readRegular(filepath.Join(src, p), func(flag int) (*os.File, error) { return root.OpenFile(p, flag, 0) }, left)
		if err != nil {
			return err
		}
		left -= int64(len(b))
		files = append(files, guestFile(path.Join(dst, p), b, fi))
		return nil
	})
	return files, err
}

// guestFile is the copy of the host file or directory fi at path dst,
// with its mode (a directory's setgid and sticky bits too) and owner.
func guestFile(dst string, content []byte, fi os.FileInfo) sandbox.GuestFile {
	f := sandbox.GuestFile{Path: dst, Content: content, Mode: fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky), Dir: fi.IsDir()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		f.UID, f.GID = st.Uid, st.Gid
	}
	return f
}

// readRegular opens a file with open, refuses it at once unless it is a
// regular file (O_NONBLOCK: a FIFO does not wait for a writer), and reads
// it whole if it holds at most limit bytes.
func readRegular(name string, open func(flag int) (*os.File, error), limit int64) ([]byte, os.FileInfo, error) {
	f, err := open(os.O_RDONLY | syscall.O_NONBLOCK)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s is not a regular file: %w", name, errdefs.ErrInvalidArgument)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, nil, err
	}
	if int64(len(b)) > limit {
		return nil, nil, fmt.Errorf("%s: the mount holds more than %d bytes: %w", name, maxCopiedFile, errdefs.ErrInvalidArgument)
	}
	return b, st, nil
}
