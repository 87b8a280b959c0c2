package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/internal/atomicfile"
	"github.com/cryo-runtime/cryo/sandbox"
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
	if err := checkHostname(spec); err != nil {
		return nil, err
	}
	dropHostNamespacePaths(spec)
	c := &container{id: r.ID, guestID: r.ID, bundle: r.Bundle, spec: spec, execs: map[string]*process{}}
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
		rc, ok, err := s.restored.Claim(spec.Annotations, first)
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
	if err := g.CreateContainer(ctx, sandbox.CreateRequest{ID: c.guestID, Spec: spec, Serial: c.disk.Serial, Files: files, Stdio: c.init.stdio}); err != nil {
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
func (s *service) reapUnclaimed(sb vmSandbox, rs *sandbox.Restored) {
	t := time.NewTimer(claimWindow)
	defer t.Stop()
	select {
	case <-t.C:
	case <-sb.Exited():
		return
	}
	ctx := context.WithoutCancel(s.ctx)
	for _, rc := range rs.Unclaimed() {
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
	spec, src, err := s.sandboxSpec(ctx, r, c)
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
	sb, rs, err := s.restoreOrBoot(ctx, r, c, spec, src)
	if err != nil {
		cleanup()
		return nil, err
	}
	if rs != nil {
		// The hook runs in the sandbox's own container (in a pod, the one
		// that booted the VM) before any task is handed over.
		if err := sb.RunHook(ctx, rs.SandboxID(), spec.Request.PostRestore, "post-restore"); err != nil {
			_ = sb.Shutdown(ctx)
			cleanup()
			return nil, err
		}
	}
	s.mu.Lock()
	s.sb, s.restored = sb, rs
	s.mu.Unlock()
	if err := s.serveExtension(sb); err != nil {
		log.G(ctx).WithError(err).Warn("serve cryo api: cryoctl cannot reach this sandbox")
	}
	go s.monitor(sb)
	if rs != nil {
		go s.reapUnclaimed(sb, rs)
	}
	return sb, nil
}

// sandboxSpec is the sandbox of the first container c: the node config,
// what c's annotations ask for, its directories, and where a restore comes
// from (none: Source.URL is empty).
func (s *service) sandboxSpec(ctx context.Context, r *taskAPI.CreateTaskRequest, c *container) (sandbox.Spec, sandbox.Source, error) {
	cfg, err := loadConfig(r)
	if err != nil {
		return sandbox.Spec{}, sandbox.Source{}, err
	}
	req, err := annotations.Parse(c.spec.Annotations, cfg)
	if err != nil {
		return sandbox.Spec{}, sandbox.Source{}, err
	}
	src := sandbox.Source{URL: req.RestoreFrom, Digest: req.RestoreDigest}
	if r.Checkpoint != "" {
		if src, err = readCheckpointRef(r.Checkpoint); err != nil {
			return sandbox.Spec{}, sandbox.Source{}, err
		}
	}
	ns, _ := namespaces.Namespace(ctx)
	stateDir := sandboxStateDir(cfg.Runtime.StateRoot, ns, r.ID)
	spec := sandbox.Spec{
		ID: r.ID, Config: cfg, StateDir: stateDir, DiskDir: filepath.Join(cfg.Runtime.DiskRoot, filepath.Base(stateDir)),
		Pod: c.spec, Request: req, Tenant: s.tenant(c.spec.Annotations),
	}
	return spec, src, nil
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
// it otherwise or, when the restore fails and the policy says so, instead.
func (s *service) restoreOrBoot(ctx context.Context, r *taskAPI.CreateTaskRequest, c *container, spec sandbox.Spec, src sandbox.Source) (vmSandbox, *sandbox.Restored, error) {
	if src.URL != "" {
		rctx, cancel := context.WithTimeout(ctx, restoreTimeout)
		sb, rs, err := s.vms.Restore(rctx, spec, src)
		cancel()
		switch {
		case err == nil:
			return sb, rs, nil
		case spec.Request.RestoreFallback == "cold" && r.Checkpoint == "":
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
	c.disk = sb.RootDisk()
	return sb, nil, nil
}

// removeSandbox undoes newSandbox after a later step of Create failed.
func (s *service) removeSandbox(ctx context.Context, sb vmSandbox) {
	s.closeExtension()
	_ = sb.Shutdown(ctx)
	_ = os.RemoveAll(s.diskDir)
	_ = os.Remove(statePointerPath(s.bundle))
	s.mu.Lock()
	s.sb, s.restored = nil, nil
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
	return p.start(func() (uint32, error) {
		pid, err := s.sb.Guest().StartProcess(ctx, c.guestID, p.execID)
		if err != nil {
			return 0, s.withVMFailure(fmt.Errorf("start %s: %w", p.name(), err))
		}
		// containerd is told the VM's pid; the guest's is for the logs.
		log.G(ctx).WithFields(log.Fields{"process": p.name(), "guest_pid": pid, "qemu_pid": s.vmPid()}).Debug("started in guest")
		return pid, nil
	})
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
		return s.withVMFailure(fmt.Errorf("exec in container %s that is %s: %w", c.id, init, errdefs.ErrFailedPrecondition))
	}
	p := newProcess(c.id, r.ExecID, stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal})
	if err := c.addExec(p); err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			c.removeExec(r.ExecID)
		}
	}()
	g := s.sb.Guest()
	if err := g.ExecProcess(ctx, c.guestID, r.ExecID, &spec, p.stdio); err != nil {
		return s.withVMFailure(fmt.Errorf("exec %s in guest: %w", p.name(), err))
	}
	var err error
	if p.io, err = openIO(ctx, p.stdio); err != nil {
		return err
	}
	p.io.start(s.ctx, g, c.guestID, r.ExecID)
	return nil
}

func (s *service) kill(ctx context.Context, c *container, p *process, sig uint32, all bool) error {
	if done, err := s.killUnstarted(c, p, sig); done {
		return err
	}
	sb := s.sb
	if sb.Paused() {
		// A paused VM's agent cannot answer. SIGKILL resumes it, as runc
		// thaws a frozen container it kills; other signals would wait for
		// ever.
		if sig != uint32(unix.SIGKILL) {
			return fmt.Errorf("signal %d to %s: the sandbox vm is paused, resume it first: %w", sig, p.name(), errdefs.ErrFailedPrecondition)
		}
		if err := s.resumeAll(ctx); err != nil {
			log.G(ctx).WithError(err).WithField("id", c.id).Warn("resume the paused vm for SIGKILL: stopping it")
			sb.Stop(ctx)
			return nil
		}
	}
	err := sb.Guest().Signal(ctx, c.guestID, p.execID, sig, all)
	if sig != uint32(unix.SIGKILL) || p.execID != "" {
		return err
	}
	if err != nil {
		// SIGKILL must end the task: a guest that cannot be told to kill
		// its container loses its VM instead.
		log.G(ctx).WithError(err).WithField("id", c.id).Warn("guest did not take SIGKILL: stopping the sandbox vm")
		sb.Stop(ctx)
		return nil
	}
	go backstopKill(s.ctx, sb, c, p, killGrace)
	return nil
}

// killUnstarted ends a process that has not started (nothing runs yet: it
// ends without ever starting) or refuses one that has finished; done is
// false for a process that runs.
func (s *service) killUnstarted(c *container, p *process, sig uint32) (done bool, _ error) {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	switch p.current() {
	case stateStopped, stateDeleted:
		return true, fmt.Errorf("process %s already finished: %w", p.name(), errdefs.ErrNotFound)
	case stateCreated:
		if p.setExited(128+sig, time.Now()) {
			p.io.close()
			s.publishExit(c, p)
		}
		return true, nil
	}
	return false, nil
}

// resumeAll resumes the sandbox's VM and every container paused through the
// task API.
func (s *service) resumeAll(ctx context.Context) error {
	if err := s.sb.Resume(ctx); err != nil {
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

// killGrace (a variable for tests) is how long a SIGKILLed init may take to be reported dead by
// the guest before the shim stops the VM itself.
var killGrace = 10 * time.Second

// backstopKill stops the VM when the guest took a SIGKILL for p but does not
// report its exit within grace: the task's exit then comes from the VM's
// (monitor), and no Wait or Delete is left hanging on a broken guest.
// grace is read when the kill is taken, not here: a test that changes
// killGrace must not race an earlier test's backstop.
func backstopKill(ctx context.Context, sb vmSandbox, c *container, p *process, grace time.Duration) {
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-sb.Exited():
	case <-t.C:
		log.G(ctx).WithField("id", c.id).Warnf("no exit from the guest %s after SIGKILL: stopping the sandbox vm", grace)
		sb.Stop(ctx)
	}
}

// waitExit waits for a started process to exit in the guest, drains its
// output, and publishes its exit. An init exit is published after the exits
// of the container's execs, as the runtime-v2 contract requires.
func (s *service) waitExit(c *container, p *process) {
	ctx := log.WithLogger(s.ctx, log.G(s.ctx).WithField("process", p.name()))
	status, at, err := s.sb.Guest().Wait(ctx, c.guestID, p.execID)
	if err != nil {
		log.G(ctx).WithError(err).Debug("wait for process in guest")
		status, at = exitKilled, time.Now()
		if failure, gone := s.vmStopped(vmFailureWait); gone {
			p.io.notice(vmStoppedLine(failure))
		}
	}
	// What the process printed before it exited reaches containerd before
	// its exit does.
	p.io.drain()
	s.closeOutput(p)
	if p.execID == "" {
		deadline := time.After(5 * time.Second)
		for _, e := range c.runningExecs() {
			select {
			case <-e.exited:
			case <-deadline:
			}
		}
		if err := writeExitRecord(c.bundle, exitRecord{Pid: int(s.taskPid(p)), Status: int(status), ExitedAt: at}); err != nil {
			log.G(ctx).WithError(err).Warn("record exit in bundle")
		}
	}
	if p.setExited(status, at) {
		s.publishExit(c, p)
	}
	if p.execID != "" {
		// The first exec's answer is in: a lazy sandbox's prefetch may
		// take the link now.
		s.sb.Interacted()
	}
}

// closeOutput closes containerd's side of p's streams once nothing more
// can come, as runc's shim does: clients such as `ctr run` wait for EOF on
// them. An init's end ends its container, so its streams close now. An
// exec's stay open while the guest still has writers on them (a
// background child, `sh -c "sleep 10 &"`): they close at the guest's EOF,
// when the last writer closed, or at the exec's Delete. CRI's ExecSync
// waits drain_exec_sync_io_timeout for that EOF, then deletes the exec.
func (s *service) closeOutput(p *process) {
	if p.execID == "" {
		p.io.close()
		return
	}
	go p.io.closeAfterCopies()
}

func (s *service) publishExit(c *container, p *process) {
	status, at := p.exit()
	s.send(&eventstypes.TaskExit{
		ContainerID: c.id, ID: processEventID(c, p), Pid: s.taskPid(p), ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at),
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
// Each process it ends gets a last line of output saying why (see
// vmStoppedLine): containerd's TaskExit has no field for a reason.
func (s *service) monitor(sb vmSandbox) {
	<-sb.Exited()
	failure := sb.Failure()
	l := log.G(s.ctx).WithField("stderr", sb.Stderr())
	if failure != nil {
		l = l.WithError(failure)
	}
	l.Warn("sandbox vm exited")
	line := vmStoppedLine(failure)
	s.mu.Lock()
	cs := make([]*container, 0, len(s.containers))
	for _, c := range s.containers {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	now := time.Now()
	end := func(c *container, p *process, wg *sync.WaitGroup) {
		defer wg.Done()
		p.io.notice(line)
		if p.setExited(exitKilled, now) {
			p.io.close()
			s.publishExit(c, p)
		}
	}
	// The notices take up to seconds each: every exec at once, then the
	// inits, whose exits come after their execs'.
	var execs, inits sync.WaitGroup
	for _, c := range cs {
		for _, e := range c.runningExecs() {
			execs.Add(1)
			go end(c, e, &execs)
		}
	}
	execs.Wait()
	for _, c := range cs {
		if st := c.init.current(); st == stateRunning || st == statePaused || st == stateCreated || st == stateCreatedCheckpoint {
			_ = writeExitRecord(c.bundle, exitRecord{Pid: int(s.taskPid(c.init)), Status: int(exitKilled), ExitedAt: now})
			inits.Add(1)
			go end(c, c.init, &inits)
		}
	}
	inits.Wait()
}

// vmFailureWait is how long a guest call that lost its connection waits
// for the VM's exit, to tell why it stopped.
const vmFailureWait = 2 * time.Second

// vmStopped reports whether the sandbox's VM has exited, waiting up to
// wait for it, and why it stopped when the sandbox knows.
func (s *service) vmStopped(wait time.Duration) (failure error, gone bool) {
	sb := s.sb
	if sb == nil {
		return nil, false
	}
	select {
	case <-sb.Exited():
		return sb.Failure(), true
	default:
	}
	if wait <= 0 {
		return nil, false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-sb.Exited():
		return sb.Failure(), true
	case <-t.C:
		return nil, false
	}
}

// withVMFailure adds why the VM stopped to err when the VM is gone: a
// call whose connection broke because the VM died under it (a lazy
// restore's page that could not be served) waits for that exit, since the
// connection's error alone does not say why. Any other error comes back at
// once, with the reason only if the VM is already gone.
func (s *service) withVMFailure(err error) error {
	var wait time.Duration
	if connectionLost(err) {
		wait = vmFailureWait
	}
	if failure, gone := s.vmStopped(wait); gone {
		return fmt.Errorf("%w: %s", err, vmStoppedLine(failure))
	}
	return err
}

// connectionLost tells a guest call that failed because its connection
// broke from one the guest refused.
func connectionLost(err error) bool {
	for _, e := range []error{ttrpc.ErrClosed, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, unix.ECONNRESET, unix.EPIPE, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// vmStoppedLine is the last line of output of a process whose VM stopped
// under it, with the reason when the sandbox knows it. It never holds
// anything the guest sent.
func vmStoppedLine(failure error) string {
	if failure == nil {
		return "cryo: the sandbox vm stopped"
	}
	return "cryo: the sandbox vm stopped: " + failure.Error()
}

// deleteContainer removes a stopped container from the guest and the host;
// the last container takes the VM with it, and needs no tidying inside it.
func (s *service) deleteContainer(ctx context.Context, c *container) {
	sb := s.sb
	ctx = context.WithoutCancel(ctx)
	s.mu.Lock()
	delete(s.containers, c.id)
	last := len(s.containers) == 0
	s.mu.Unlock()
	s.writeContainerIndex()
	if last {
		s.closeExtension()
		if err := sb.Shutdown(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("shut down sandbox vm")
		}
		_ = os.Remove(statePointerPath(s.bundle))
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

func removeFromGuest(ctx context.Context, sb vmSandbox, c *container) {
	select {
	case <-sb.Exited():
		return
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, guestCleanupTimeout)
	defer cancel()
	if err := sb.Guest().RemoveContainer(ctx, c.guestID); err != nil {
		log.G(ctx).WithError(err).WithField("id", c.id).Warn("remove container in guest")
	}
	if c.hotplugged {
		if err := sb.RemoveRootDisk(ctx, c.disk.ID); err != nil {
			log.G(ctx).WithError(err).WithField("id", c.id).Warn("unplug root disk")
		}
	}
}

func statePointerPath(bundle string) string { return bundle + "/" + statePointerFile }
