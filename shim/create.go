package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/internal/atomicfile"
	"github.com/cryo-runtime/cryo/nodeopts"
	"github.com/cryo-runtime/cryo/sandbox"
)

// restoreTimeout bounds a restore, from resolving the snapshot to a guest
// that answers: every wait in it (store I/O, the node cache's locks held by
// other shims, QEMU) ends with it.
const restoreTimeout = 10 * time.Minute

// createContainer prepares the container's root disk, boots or restores the
// sandbox VM if this is its first container (hot-plugs the disk otherwise),
// and creates the container in the guest, or takes over the guest container
// of a restored sandbox.
func (s *service) createContainer(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *container, retErr error) {
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, err
	}
	if err := checkHostname(spec); err != nil {
		return nil, err
	}
	joins := s.podNamespaces(spec)
	sharesPid := namesNamespace(spec, specs.PIDNamespace)
	dropHostNamespacePaths(spec)
	c := &container{id: r.ID, guestID: r.ID, bundle: r.Bundle, spec: spec, sharesPid: sharesPid, execs: map[string]*process{}}
	c.init = newProcess(r.ID, "", stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal})

	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	first := sb == nil
	if first {
		if sb, err = s.newSandbox(ctx, r, c); err != nil {
			return nil, err
		}
		defer func() {
			if retErr != nil {
				s.removeSandbox(ctx, sb)
			}
		}()
	}
	if s.restored != nil {
		rc, ok, err := s.restored.claim(spec.Annotations, first)
		if err != nil {
			return nil, err
		}
		if ok {
			return c, s.adoptContainer(ctx, sb, c, rc)
		}
	}
	if !first || c.disk.ID == "" {
		if err := s.hotplugRoot(ctx, sb, c, r); err != nil {
			return nil, err
		}
		defer func() {
			if retErr != nil {
				s.unplugRoot(ctx, sb, c)
			}
		}()
	}

	files := guestFiles(ctx, spec)
	g := sb.Guest()
	req := sandbox.CreateRequest{ID: c.guestID, Spec: spec, Serial: c.disk.Serial, Files: files, Stdio: c.init.stdio,
		JoinContainer: joins.from, Join: joins.namespaces, PidContainer: joins.pid}
	if err := g.CreateContainer(ctx, req); err != nil {
		return nil, fmt.Errorf("create container %s in guest: %w", r.ID, err)
	}
	if c.init.io, err = openIO(ctx, c.init.stdio); err != nil {
		_ = g.RemoveContainer(context.WithoutCancel(ctx), c.guestID)
		return nil, err
	}
	c.init.io.start(s.ctx, g, c.guestID, "")
	s.addContainer(c)
	return c, nil
}

// hotplugRoot makes the root disk of a container that the VM did not boot
// with, and hot-plugs it.
func (s *service) hotplugRoot(ctx context.Context, sb vmSandbox, c *container, r *taskAPI.CreateTaskRequest) error {
	c.workDir = filepath.Join(s.diskDir, sandbox.DiskID(r.ID))
	if err := os.MkdirAll(c.workDir, 0o700); err != nil {
		return err
	}
	d, err := sb.AddRootDisk(ctx, sandbox.RootSpec{ContainerID: r.ID, Bundle: r.Bundle, WorkDir: c.workDir, Mounts: r.Rootfs})
	if err != nil {
		os.RemoveAll(c.workDir)
		return err
	}
	c.disk, c.hotplugged = d, true
	return nil
}

// unplugRoot undoes hotplugRoot.
func (s *service) unplugRoot(ctx context.Context, sb vmSandbox, c *container) {
	_ = sb.RemoveRootDisk(context.WithoutCancel(ctx), c.disk.ID)
	os.RemoveAll(c.workDir)
}

// adoptContainer makes c the task of a guest container that a restore
// brought back: its processes are the checkpointed ones, still running.
func (s *service) adoptContainer(ctx context.Context, sb vmSandbox, c *container, rc sandbox.RecordContainer) error {
	c.guestID = rc.GuestID
	c.disk.ID = rc.Disk
	c.workDir = filepath.Join(s.diskDir, rc.Disk)
	pid, err := sb.Adopt(ctx, rc, c.spec.Hostname)
	if err != nil {
		return err
	}
	c.init.setGuestPid(pid)
	if err := c.init.transition(stateCreatedCheckpoint); err != nil {
		return err
	}
	if c.init.io, err = openIO(ctx, c.init.stdio); err != nil {
		return err
	}
	c.init.io.start(s.ctx, sb.Guest(), c.guestID, "")
	s.addContainer(c)
	log.G(ctx).WithFields(log.Fields{"id": c.id, "guest_id": c.guestID, "guest_pid": pid}).Info("took over restored container")
	return nil
}

// claimWindow is how long the guest containers of a restored sandbox wait
// for the tasks that take them over: a pod's containers arrive one by one,
// each after its image pull. What no task claimed by then is killed, so that
// no checkpointed process runs on in the VM with nothing to report, signal
// or reap it.
var claimWindow = 5 * time.Minute

// reapUnclaimed kills, once claimWindow has passed, the restored guest
// containers that no task took over.
func (s *service) reapUnclaimed(sb vmSandbox, rs *restoredPod) {
	t := time.NewTimer(claimWindow)
	defer t.Stop()
	select {
	case <-t.C:
	case <-sb.Done():
		return
	}
	ctx := context.WithoutCancel(s.ctx)
	for _, rc := range rs.unclaimed() {
		log.G(ctx).WithFields(log.Fields{"guest_id": rc.GuestID, "name": rc.Name}).
			Warnf("no container of the restored pod took this checkpointed container over within %s: killing its processes", claimWindow)
		if err := sb.Guest().Signal(ctx, rc.GuestID, "", uint32(unix.SIGKILL), true); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("guest_id", rc.GuestID).Warn("kill unclaimed container")
		}
		if err := sb.Guest().RemoveContainer(ctx, rc.GuestID); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("guest_id", rc.GuestID).Warn("remove unclaimed container")
		}
	}
}

func (s *service) addContainer(c *container) {
	s.mu.Lock()
	s.created++
	c.seq = s.created
	s.containers[c.id] = c
	if name := c.spec.Annotations[annotations.CRIContainerName]; name != "" {
		if s.ran == nil {
			s.ran = map[string]bool{}
		}
		s.ran[name] = true
	}
	s.mu.Unlock()
	s.writeContainerIndex()
}

// newSandbox creates the sandbox for its first container c: it restores it
// when c's annotations or containerd's checkpoint ask for it (falling back
// to a cold boot when the policy says so), and boots it otherwise, with c's
// root disk attached at boot.
func (s *service) newSandbox(ctx context.Context, r *taskAPI.CreateTaskRequest, c *container) (_ vmSandbox, retErr error) {
	spec, req, src, err := s.sandboxSpec(ctx, r, c)
	if err != nil {
		return nil, err
	}
	cleanup := func() {
		os.RemoveAll(spec.StateDir)
		os.RemoveAll(spec.DiskDir)
		_ = os.Remove(statePointerPath(r.Bundle))
	}
	if err := writePointers(r.Bundle, spec.StateDir, spec.DiskDir); err != nil {
		cleanup()
		return nil, err
	}
	s.diskDir, s.bundle = spec.DiskDir, r.Bundle
	sb, rs, err := s.restoreOrBoot(ctx, r, c, spec, req.RestoreFallback, src)
	if err != nil {
		cleanup()
		return nil, err
	}
	s.mu.Lock()
	s.sb, s.spec = sb, spec
	if rs != nil {
		s.restored = newRestored(rs)
	}
	restored := s.restored
	s.mu.Unlock()
	if err := s.serveExtension(spec.StateDir); err != nil {
		log.G(ctx).WithError(err).Warn("serve cryo api: cryoctl cannot reach this sandbox")
	}
	go s.monitor(sb)
	if restored != nil {
		go s.reapUnclaimed(sb, restored)
	}
	return sb, nil
}

// sandboxSpec is the sandbox of the first container c: the node config,
// what c's annotations ask for (req, of which the sandbox takes its part),
// its directories, and where a restore comes from (none: Source.URL is
// empty).
func (s *service) sandboxSpec(ctx context.Context, r *taskAPI.CreateTaskRequest, c *container) (_ sandbox.Spec, req annotations.Request, _ sandbox.Source, _ error) {
	cfg, err := loadConfig(r)
	if err != nil {
		return sandbox.Spec{}, req, sandbox.Source{}, err
	}
	req, err = annotations.Parse(c.spec.Annotations, cfg)
	if err != nil {
		return sandbox.Spec{}, req, sandbox.Source{}, err
	}
	src := sandbox.Source{URL: req.RestoreFrom, Digest: req.RestoreDigest}
	if r.Checkpoint != "" {
		if src, err = readCheckpointRef(r.Checkpoint); err != nil {
			return sandbox.Spec{}, req, sandbox.Source{}, err
		}
	}
	node, err := nodeopts.Sandbox(cfg)
	if err != nil {
		return sandbox.Spec{}, req, sandbox.Source{}, err
	}
	ns, _ := namespaces.Namespace(ctx)
	stateDir := sandboxStateDir(cfg.Runtime.StateRoot, ns, r.ID)
	spec := sandbox.Spec{
		ID: r.ID, Node: node, StateDir: stateDir, DiskDir: filepath.Join(cfg.Runtime.DiskRoot, filepath.Base(stateDir)),
		Pod: c.spec, Tenant: s.tenant(c.spec.Annotations),
		VCPUs: req.VCPUs, MemoryMiB: req.MemoryMiB, RestoreMode: req.RestoreMode,
		CheckpointTo: req.CheckpointTo, PreCheckpoint: req.PreCheckpoint, PostRestore: req.PostRestore,
		FitsPod: func(vcpus, memoryMiB int) error {
			return annotations.CheckRestoredSize(c.spec.Annotations, cfg, vcpus, memoryMiB)
		},
	}
	return spec, req, src, nil
}

// writePointers makes the sandbox's directories and the files that lead
// `shim delete` to them from the bundle.
func writePointers(bundle, stateDir, diskDir string) error {
	for _, d := range []string{stateDir, diskDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create sandbox dir: %w", err)
		}
	}
	if err := writeStatePointer(bundle, stateDir); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(stateDir, diskPointerFile), []byte(diskDir+"\n"), 0o600)
}

// restoreOrBoot restores the sandbox when src names a snapshot, and boots
// it otherwise or, when the restore fails and the pod's fallback policy
// says so ("cold"), instead.
func (s *service) restoreOrBoot(ctx context.Context, r *taskAPI.CreateTaskRequest, c *container, spec sandbox.Spec, fallback string, src sandbox.Source) (vmSandbox, *sandbox.Restored, error) {
	if src.URL != "" {
		rctx, cancel := context.WithTimeout(ctx, restoreTimeout)
		sb, rs, err := s.vms.Restore(rctx, spec, src)
		cancel()
		switch {
		case err == nil:
			return sb, rs, nil
		case fallback == "cold" && r.Checkpoint == "" && !errors.As(err, new(*sandbox.HookError)):
			log.G(ctx).WithError(err).Warn("restore failed; booting cold (restore-fallback: cold)")
			// Drop the restore's overlays; the boot makes the disk dirs anew.
			os.RemoveAll(spec.DiskDir)
		default:
			return nil, nil, err
		}
	}
	c.workDir = filepath.Join(spec.DiskDir, sandbox.DiskID(r.ID))
	if err := os.MkdirAll(c.workDir, 0o700); err != nil {
		return nil, nil, err
	}
	sb, err := s.vms.Boot(ctx, spec, sandbox.RootSpec{ContainerID: r.ID, Bundle: r.Bundle, WorkDir: c.workDir, Mounts: r.Rootfs})
	if err != nil {
		return nil, nil, err
	}
	c.disk = sb.Info().RootDisk
	return sb, nil, nil
}

// removeSandbox undoes newSandbox after a later step of Create failed.
func (s *service) removeSandbox(ctx context.Context, sb vmSandbox) {
	s.closeExtension()
	_ = sb.Shutdown(ctx)
	_ = os.RemoveAll(s.diskDir)
	_ = os.Remove(statePointerPath(s.bundle))
	s.mu.Lock()
	s.sb, s.spec, s.restored = nil, sandbox.Spec{}, nil
	s.mu.Unlock()
}

// loadConfig reads the node config named by the runtime options' ConfigPath
// (containerd's per-runtime override), or the default path.
func loadConfig(r *taskAPI.CreateTaskRequest) (configs.Config, error) {
	path := ""
	if r.Options != nil {
		v, err := typeurl.UnmarshalAny(r.Options)
		if err != nil {
			return configs.Config{}, fmt.Errorf("runtime options: %w", err)
		}
		if o, ok := v.(*runtimeoptions.Options); ok {
			path = o.ConfigPath
		}
	}
	return configs.Load(path)
}
