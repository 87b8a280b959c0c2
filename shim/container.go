package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/vmm"
)

// container is one OCI container inside the sandbox VM.
type container struct {
	id string
	// guestID names the container in the guest: its own id, or, in a
	// sandbox restored from a snapshot, the id it had when checkpointed.
	guestID string
	// adopted is set when the task took over a guest container that a
	// restore brought back, instead of creating one.
	adopted bool
	bundle  string
	spec    *specs.Spec
	disk    vmm.Disk
	// hotplugged disks are removed from the VM when the container is deleted;
	// the sandbox's first disk goes away with the VM.
	hotplugged bool
	workDir    string // writable overlay and other per-container files

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

// guestFiles turns the spec's bind mounts of small host files (resolv.conf,
// hosts, hostname, termination-log, secrets) into files copied into the
// container, and drops them from the spec: the guest cannot see host paths.
// Bind mounts of directories are copied when they hold only small regular
// files; anything else is dropped with a warning.
func guestFiles(ctx context.Context, s *specs.Spec) []guestFile {
	var files []guestFile
	kept := s.Mounts[:0]
	for _, m := range s.Mounts {
		if m.Type != "bind" && !hasOption(m.Options, "bind") && !hasOption(m.Options, "rbind") || m.Destination == "/dev/shm" {
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
	}
	s.Mounts = kept
	return files
}

func copyTree(src, dst string) ([]guestFile, error) {
	st, err := os.Stat(src)
	if err != nil {
		return nil, err
	}
	if st.Mode().IsRegular() {
		if st.Size() > maxCopiedFile {
			return nil, fmt.Errorf("%s is larger than %d bytes", src, maxCopiedFile)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		return []guestFile{{Path: dst, Content: b, Mode: st.Mode().Perm()}}, nil
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s is not a regular file or directory", src)
	}
	var files []guestFile
	var total int64
	err = filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		// Kubernetes secret and configmap volumes use ..data symlinks.
		if fi.Mode()&os.ModeSymlink != 0 {
			if fi, err = os.Stat(p); err != nil || fi.IsDir() {
				return err
			}
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		if total += fi.Size(); total > maxCopiedFile {
			return fmt.Errorf("%s holds more than %d bytes", src, maxCopiedFile)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, src)
		files = append(files, guestFile{Path: filepath.Join(dst, rel), Content: b, Mode: fi.Mode().Perm()})
		return nil
	})
	return files, err
}
