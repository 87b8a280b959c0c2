package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/network"
	"github.com/cryo-runtime/cryo/vmm"
)

// restoreTimeout bounds a restore, from resolving the snapshot to a guest
// that answers: every wait in it (store I/O, the node cache's locks held by
// other shims, QEMU) ends with it.
const restoreTimeout = 10 * time.Minute

// exitKilled is the status of processes that die with their VM.
const exitKilled = 128 + uint32(unix.SIGKILL)

// createContainer prepares the container's root disk, boots or restores the
// sandbox VM if this is its first container (hot-plugs the disk otherwise),
// and creates the container in the guest, or takes over the guest container
// of a restored sandbox.
func (s *service) createContainer(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *container, retErr error) {
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, err
	}
	dropHostNamespacePaths(spec)
	c := &container{id: r.ID, guestID: r.ID, bundle: r.Bundle, spec: spec, execs: map[string]*process{}}
	c.init = newProcess(r.ID, "", stdio{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr, terminal: r.Terminal})

	s.mu.Lock()
	sb := s.sandbox
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
		if rc, ok := s.restored.claim(spec.Annotations, first); ok {
			return c, s.adoptContainer(ctx, sb, c, rc)
		}
	}
	if !first || c.disk.ID == "" {
		// Not attached at boot (coldBoot made the first container's disk):
		// hot-plug it.
		c.workDir = filepath.Join(sb.diskDir, diskID(r.ID))
		if err := os.MkdirAll(c.workDir, 0o700); err != nil {
			return nil, err
		}
		defer func() {
			if retErr != nil {
				os.RemoveAll(c.workDir)
			}
		}()
		if c.disk, err = sb.rootfs.disk(ctx, r.ID, r.Bundle, c.workDir, r.Rootfs); err != nil {
			return nil, err
		}
		if err := sb.vm.HotplugDisk(ctx, c.disk); err != nil {
			return nil, fmt.Errorf("hot-plug root disk of %s: %w", r.ID, err)
		}
		c.hotplugged = true
		defer func() {
			if retErr != nil {
				_ = sb.vm.UnplugDisk(context.WithoutCancel(ctx), c.disk.ID)
			}
		}()
	}

	files := guestFiles(ctx, spec)
	if err := sb.agent.createContainer(ctx, createRequest{ID: c.guestID, Spec: spec, Serial: c.disk.Serial, Files: files, Stdio: c.init.stdio}); err != nil {
		return nil, fmt.Errorf("create container %s in guest: %w", r.ID, err)
	}
	if c.init.io, err = openIO(ctx, c.init.stdio); err != nil {
		_ = sb.agent.removeContainer(context.WithoutCancel(ctx), c.guestID)
		return nil, err
	}
	c.init.io.start(s.ctx, sb.agent, c.guestID, "")
	s.addContainer(c)
	return c, nil
}

// adoptContainer makes c the task of a guest container that a restore
// brought back: its processes are the checkpointed ones, still running.
func (s *service) adoptContainer(ctx context.Context, sb *sandbox, c *container, rc recordContainer) error {
	c.guestID, c.adopted = rc.GuestID, true
	c.disk.ID = rc.Disk
	c.workDir = filepath.Join(sb.diskDir, rc.Disk)
	infos, err := sb.agent.listContainers(ctx)
	if err != nil {
		return fmt.Errorf("restore: list guest containers: %w", err)
	}
	for _, in := range infos {
		if in.Id == rc.GuestID {
			c.init.setPid(in.InitPid)
		}
	}
	if c.init.getPid() == 0 {
		return fmt.Errorf("restore: guest has no running container %s: %w", rc.GuestID, errdefs.ErrNotFound)
	}
	if h := c.spec.Hostname; h != "" && h != rc.Spec.Hostname {
		if _, _, err := sb.agent.runHook(ctx, rc.GuestID, []string{"hostname", h}, 10*time.Second); err != nil {
			return fmt.Errorf("restore: set hostname: %w", err)
		}
	}
	if c.init.io, err = openIO(ctx, c.init.stdio); err != nil {
		return err
	}
	c.init.io.start(s.ctx, sb.agent, c.guestID, "")
	s.addContainer(c)
	log.G(ctx).WithFields(log.Fields{"id": c.id, "guest_id": c.guestID, "pid": c.init.getPid()}).Info("took over restored container")
	return nil
}

func (s *service) addContainer(c *container) {
	s.mu.Lock()
	s.containers[c.id] = c
	s.mu.Unlock()
	s.writeContainerIndex()
}

// newSandbox creates the sandbox for its first container c: it restores it
// when c's annotations or containerd's checkpoint ask for it (falling back
// to a cold boot when the policy says so), and boots it otherwise, with c's
// root disk attached at boot.
func (s *service) newSandbox(ctx context.Context, r *taskAPI.CreateTaskRequest, c *container) (_ *sandbox, retErr error) {
	cfg, err := loadConfig(r)
	if err != nil {
		return nil, err
	}
	req, err := annotations.Parse(c.spec.Annotations, cfg)
	if err != nil {
		return nil, err
	}
	src := restoreSource{URL: req.RestoreFrom, Digest: req.RestoreDigest}
	if r.Checkpoint != "" {
		if src, err = readCheckpointRef(r.Checkpoint); err != nil {
			return nil, err
		}
	}
	ns, _ := namespaces.Namespace(ctx)
	stateDir := sandboxStateDir(cfg.Runtime.StateRoot, ns, r.ID)
	diskDir := filepath.Join(cfg.Runtime.DiskRoot, filepath.Base(stateDir))
	for _, d := range []string{stateDir, diskDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create sandbox dir: %w", err)
		}
	}
	cleanup := func() {
		os.RemoveAll(stateDir)
		os.RemoveAll(diskDir)
		_ = os.Remove(statePointerPath(r.Bundle))
	}
	err = writeStatePointer(r.Bundle, stateDir)
	if err == nil {
		err = writeFileAtomic(filepath.Join(stateDir, diskPointerFile), []byte(diskDir+"\n"), 0o600)
	}
	if err != nil {
		cleanup()
		return nil, err
	}

	var sb *sandbox
	if src.URL != "" {
		var rs *restoredSandbox
		rctx, cancel := context.WithTimeout(ctx, restoreTimeout)
		sb, rs, err = s.restoreSandbox(rctx, r.ID, c.spec, cfg, src, stateDir, diskDir)
		cancel()
		switch {
		case err == nil:
			s.restored = rs
		case req.RestoreFallback == "cold" && r.Checkpoint == "":
			log.G(ctx).WithError(err).Warn("restore failed; booting cold (restore-fallback: cold)")
			// Drop the restore's overlays; coldBoot makes the disk dirs anew.
			os.RemoveAll(diskDir)
		default:
			cleanup()
			return nil, err
		}
	}
	if sb == nil {
		if sb, err = s.coldBoot(ctx, r, c, cfg, req, stateDir, diskDir); err != nil {
			cleanup()
			return nil, err
		}
	}
	sb.bundle, sb.req, sb.annotations = r.Bundle, req, c.spec.Annotations
	if s.restored != nil {
		// The hook runs in the sandbox's own container (in a pod, the one
		// that booted the VM) before any task is handed over.
		if err := runHook(ctx, sb, s.restored.record.SandboxID, req.PostRestore, "post-restore"); err != nil {
			_ = sb.shutdown(ctx)
			cleanup()
			return nil, err
		}
	}
	s.mu.Lock()
	s.sandbox = sb
	s.mu.Unlock()
	if err := s.serveExtension(sb); err != nil {
		log.G(ctx).WithError(err).Warn("serve cryo api: cryoctl cannot reach this sandbox")
	}
	go s.monitor(sb)
	return sb, nil
}

// coldBoot boots a new VM with c's root disk attached at boot.
func (s *service) coldBoot(ctx context.Context, r *taskAPI.CreateTaskRequest, c *container, cfg configs.Config, req annotations.Request, stateDir, diskDir string) (*sandbox, error) {
	c.workDir = filepath.Join(diskDir, diskID(r.ID))
	if err := os.MkdirAll(c.workDir, 0o700); err != nil {
		return nil, err
	}
	rb := &rootfsBuilder{cacheDir: cfg.Runtime.ImageCache, writableMiB: cfg.Runtime.WritableDiskMiB}
	disk, err := rb.disk(ctx, r.ID, r.Bundle, c.workDir, r.Rootfs)
	if err != nil {
		return nil, err
	}
	c.disk = disk
	pn, err := setupNetwork(ctx, c.spec, network.Options{})
	if err != nil {
		return nil, err
	}
	sb, err := bootSandbox(ctx, r.ID, cfg, stateDir, vmSize{vcpus: req.VCPUs, memoryMiB: req.MemoryMiB}, []vmm.Disk{disk}, pn)
	if err != nil {
		pn.teardown(ctx)
		return nil, err
	}
	sb.diskDir = diskDir
	return sb, nil
}

// removeSandbox undoes newSandbox after a later step of Create failed.
func (s *service) removeSandbox(ctx context.Context, sb *sandbox) {
	_ = sb.shutdown(ctx)
	_ = os.RemoveAll(sb.diskDir)
	_ = os.Remove(statePointerPath(sb.bundle))
	s.mu.Lock()
	s.sandbox, s.restored = nil, nil
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

func (s *service) startProcess(ctx context.Context, c *container, p *process) error {
	if err := p.transition(stateRunning); err != nil {
		return err
	}
	if c.adopted && p.execID == "" {
		// The restored init process has been running since before the
		// checkpoint: starting the task takes it over.
		return nil
	}
	pid, err := s.sandbox.agent.startProcess(ctx, c.guestID, p.execID)
	if err != nil {
		p.mu.Lock()
		p.state = stateCreated
		p.mu.Unlock()
		return fmt.Errorf("start %s: %w", p.name(), err)
	}
	p.setPid(pid)
	return nil
}

func (s *service) execProcess(ctx context.Context, c *container, r *taskAPI.ExecProcessRequest) (retErr error) {
	var spec specs.Process
	if r.Spec == nil {
		return fmt.Errorf("exec %s: no process spec: %w", r.ExecID, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(r.Spec.Value, &spec); err != nil {
		return fmt.Errorf("exec %s: parse process spec: %w", r.ExecID, err)
	}
	if init := c.init.current(); init != stateRunning {
		return fmt.Errorf("exec in container %s that is %s: %w", c.id, init, errdefs.ErrFailedPrecondition)
	}
	p := newProcess(c.id, r.ExecID, stdio{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr, terminal: r.Terminal})
	if err := c.addExec(p); err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			c.removeExec(r.ExecID)
		}
	}()
	if err := s.sandbox.agent.execProcess(ctx, c.guestID, r.ExecID, &spec, p.stdio); err != nil {
		return fmt.Errorf("exec %s in guest: %w", p.name(), err)
	}
	var err error
	if p.io, err = openIO(ctx, p.stdio); err != nil {
		return err
	}
	p.io.start(s.ctx, s.sandbox.agent, c.guestID, r.ExecID)
	return nil
}

func (s *service) kill(ctx context.Context, c *container, p *process, sig uint32, all bool) error {
	switch p.current() {
	case stateStopped, stateDeleted:
		return fmt.Errorf("process %s already finished: %w", p.name(), errdefs.ErrNotFound)
	case stateCreated:
		// Nothing runs yet: the process ends without ever starting.
		if p.setExited(128+sig, time.Now()) {
			p.io.close()
			s.publishExit(c, p)
		}
		return nil
	}
	sb := s.sandbox
	if s.userPaused() {
		// A paused VM's agent cannot answer. SIGKILL resumes it, as runc
		// thaws a frozen container it kills; other signals would wait for
		// ever.
		if sig != uint32(unix.SIGKILL) {
			return fmt.Errorf("signal %d to %s: the sandbox vm is paused, resume it first: %w", sig, p.name(), errdefs.ErrFailedPrecondition)
		}
		if err := s.resumeAll(ctx); err != nil {
			log.G(ctx).WithError(err).WithField("id", c.id).Warn("resume the paused vm for SIGKILL: stopping it")
			stopVM(ctx, sb)
			return nil
		}
	}
	err := sb.agent.signal(ctx, c.guestID, p.execID, sig, all)
	if sig != uint32(unix.SIGKILL) || p.execID != "" {
		return err
	}
	if err != nil {
		// SIGKILL must end the task: a guest that cannot be told to kill
		// its container loses its VM instead.
		log.G(ctx).WithError(err).WithField("id", c.id).Warn("guest did not take SIGKILL: stopping the sandbox vm")
		stopVM(ctx, sb)
		return nil
	}
	go backstopKill(s.ctx, sb, c, p)
	return nil
}

// resumeAll resumes the sandbox's VM and every container paused through the
// task API.
func (s *service) resumeAll(ctx context.Context) error {
	if err := s.sandbox.vm.Resume(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	var resumed []string
	for id, c := range s.containers {
		if c.init.current() == statePaused && c.init.transition(stateRunning) == nil {
			resumed = append(resumed, id)
		}
	}
	s.mu.Unlock()
	for _, id := range resumed {
		s.send(&eventstypes.TaskResumed{ContainerID: id})
	}
	return nil
}

// killGrace is how long a SIGKILLed init may take to be reported dead by
// the guest before the shim stops the VM itself.
const killGrace = 10 * time.Second

// backstopKill stops the VM when the guest took a SIGKILL for p but does not
// report its exit within killGrace: the task's exit then comes from the VM's
// (monitor), and no Wait or Delete is left hanging on a broken guest.
func backstopKill(ctx context.Context, sb *sandbox, c *container, p *process) {
	t := time.NewTimer(killGrace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-sb.vm.Exited():
	case <-t.C:
		log.G(ctx).WithField("id", c.id).Warnf("no exit from the guest %s after SIGKILL: stopping the sandbox vm", killGrace)
		stopVM(ctx, sb)
	}
}

// stopVM kills the sandbox's QEMU within a few seconds; monitor then ends
// every process of the sandbox.
func stopVM(ctx context.Context, sb *sandbox) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	if err := sb.vm.Shutdown(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("stop sandbox vm")
	}
}

// waitExit waits for a started process to exit in the guest, drains its
// output, and publishes its exit. An init exit is published after the exits
// of the container's execs, as the runtime-v2 contract requires.
func (s *service) waitExit(c *container, p *process) {
	ctx := log.WithLogger(s.ctx, log.G(s.ctx).WithField("process", p.name()))
	status, at, err := s.sandbox.agent.wait(ctx, c.guestID, p.execID)
	if err != nil {
		log.G(ctx).WithError(err).Debug("wait for process in guest")
		status, at = exitKilled, time.Now()
	}
	// Drain the output, then close containerd's side of the streams: clients
	// such as `ctr task exec` wait for EOF on them before they delete.
	p.io.drain()
	p.io.close()
	if p.execID == "" {
		deadline := time.After(5 * time.Second)
		for _, e := range c.runningExecs() {
			select {
			case <-e.exited:
			case <-deadline:
			}
		}
		if err := writeExitRecord(c.bundle, exitRecord{Pid: int(p.getPid()), Status: int(status), ExitedAt: at}); err != nil {
			log.G(ctx).WithError(err).Warn("record exit in bundle")
		}
	}
	if p.setExited(status, at) {
		s.publishExit(c, p)
	}
}

func (s *service) publishExit(c *container, p *process) {
	status, at := p.exit()
	s.send(&eventstypes.TaskExit{
		ContainerID: c.id, ID: processEventID(c, p), Pid: p.getPid(), ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at),
	})
}

func processEventID(c *container, p *process) string {
	if p.execID == "" {
		return c.id
	}
	return p.execID
}

// monitor ends every process of the sandbox when its VM dies (QEMU killed or
// crashed): containerd learns of the exits instead of waiting forever.
func (s *service) monitor(sb *sandbox) {
	<-sb.vm.Exited()
	log.G(s.ctx).WithField("stderr", sb.vm.Stderr()).Warn("sandbox vm exited")
	s.mu.Lock()
	cs := make([]*container, 0, len(s.containers))
	for _, c := range s.containers {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	now := time.Now()
	for _, c := range cs {
		for _, e := range c.runningExecs() {
			if e.setExited(exitKilled, now) {
				e.io.close()
				s.publishExit(c, e)
			}
		}
		if st := c.init.current(); st == stateRunning || st == statePaused || st == stateCreated {
			_ = writeExitRecord(c.bundle, exitRecord{Pid: int(c.init.getPid()), Status: int(exitKilled), ExitedAt: now})
			if c.init.setExited(exitKilled, now) {
				c.init.io.close()
				s.publishExit(c, c.init)
			}
		}
	}
}

// deleteContainer removes a stopped container from the guest and the host;
// the last container takes the VM with it, and needs no tidying inside it.
func (s *service) deleteContainer(ctx context.Context, c *container) {
	sb := s.sandbox
	ctx = context.WithoutCancel(ctx)
	s.mu.Lock()
	delete(s.containers, c.id)
	last := len(s.containers) == 0
	s.mu.Unlock()
	s.writeContainerIndex()
	if last {
		if err := sb.shutdown(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("shut down sandbox vm")
		}
		_ = os.Remove(statePointerPath(sb.bundle))
	} else {
		removeFromGuest(ctx, sb, c)
	}
	if err := os.RemoveAll(c.workDir); err != nil {
		log.G(ctx).WithError(err).Warn("remove container work dir")
	}
}

// guestCleanupTimeout bounds what deleting a container asks of a guest that
// keeps running: its removal and the unplug of its root disk.
const guestCleanupTimeout = 20 * time.Second

func removeFromGuest(ctx context.Context, sb *sandbox, c *container) {
	select {
	case <-sb.vm.Exited():
		return
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, guestCleanupTimeout)
	defer cancel()
	if err := sb.agent.removeContainer(ctx, c.guestID); err != nil {
		log.G(ctx).WithError(err).WithField("id", c.id).Warn("remove container in guest")
	}
	if c.hotplugged {
		if err := sb.vm.UnplugDisk(ctx, c.disk.ID); err != nil {
			log.G(ctx).WithError(err).WithField("id", c.id).Warn("unplug root disk")
		}
	}
}

func statePointerPath(bundle string) string { return bundle + "/" + statePointerFile }
