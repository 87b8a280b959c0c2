package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
	"github.com/cryo-runtime/cryo/sandbox/servedram"
	"github.com/cryo-runtime/cryo/vmm"
)

// Guest is the guest agent as the task service uses it: the containers and
// processes inside the VM. agentClient implements it over the agent's
// ttrpc API.
type Guest interface {
	CreateContainer(ctx context.Context, r CreateRequest) error
	StartProcess(ctx context.Context, containerID, execID string) (uint32, error)
	ExecProcess(ctx context.Context, containerID, execID string, p *specs.Process, s Stdio) error
	Signal(ctx context.Context, containerID, execID string, sig uint32, all bool) error
	Wait(ctx context.Context, containerID, execID string) (uint32, time.Time, error)
	// ReadStdio blocks until output is available; it returns io.EOF once
	// the stream is closed and drained.
	ReadStdio(ctx context.Context, containerID, execID string, stderr bool) ([]byte, error)
	WriteStdin(ctx context.Context, containerID, execID string, data []byte) error
	CloseStdin(ctx context.Context, containerID, execID string) error
	Resize(ctx context.Context, containerID, execID string, w, h uint32) error
	Pids(ctx context.Context, containerID string) ([]uint32, error)
	Stats(ctx context.Context, containerID string) (*anypb.Any, error)
	RemoveContainer(ctx context.Context, containerID string) error
	DeleteProcess(ctx context.Context, containerID, execID string) error
	// WaitOOM blocks until the container's cgroup has OOM-killed more
	// processes than seen, and returns how many it has.
	WaitOOM(ctx context.Context, containerID string, seen uint64) (uint64, error)
}

// agentConn is the guest agent as the sandbox itself uses it.
type agentConn interface {
	Guest
	networkGuest
	ping(ctx context.Context) (guestInfo, error)
	sync(ctx context.Context) error
	runHook(ctx context.Context, containerID string, argv []string, timeout time.Duration) (string, int, error)
	fixUpRestored(ctx context.Context) error
	listContainers(ctx context.Context) ([]*agentapi.ContainerInfo, error)
	close() error
}

type guestInfo struct {
	BootID, Kernel string
}

// Stdio names the streams containerd gave a process.
type Stdio struct {
	Stdin, Stdout, Stderr string
	Terminal              bool
}

// CreateRequest describes a container for the guest.
type CreateRequest struct {
	ID     string
	Spec   *specs.Spec
	Serial string // virtio-blk serial of the root disk
	Files  []GuestFile
	Stdio  Stdio
	// Join are the namespaces ("ipc", "uts") the container takes from the
	// init of guest container JoinContainer, its pod's sandbox container.
	JoinContainer string
	Join          []string
	// PidContainer, when set, is the guest container in whose init's pid
	// namespace the container's init is made.
	PidContainer string
}

// GuestFile is a small host file copied into the container: a VM cannot
// bind-mount host paths.
type GuestFile struct {
	Path    string
	Content []byte
	// Mode is the permission bits, with setuid, setgid and sticky.
	Mode     os.FileMode
	UID, GID uint32
	// Dir: a directory of a copied mount (no content).
	Dir bool
}

// Spec is what a sandbox is made from, booted or restored.
type Spec struct {
	ID string
	// Node is what the sandbox takes of its node.
	Node Node
	// StateDir holds the VM's sockets and state (tmpfs); DiskDir its
	// writable disks (qcow2 overlays), on disk.
	StateDir, DiskDir string
	// Pod is the OCI spec of the container that creates the sandbox: its
	// annotations and the network namespace the VM's NIC is bridged to.
	Pod *specs.Spec
	// VCPUs and MemoryMiB size a booted VM (a restored one has its
	// snapshot's size).
	VCPUs, MemoryMiB int
	// RestoreMode is how a restore gets the snapshot's RAM: RestoreLazy
	// serves it page by page, RestoreEager fetches it whole first.
	RestoreMode string
	// CheckpointTo is where a checkpoint goes when its request names no
	// store; PreCheckpoint the hook (sh -c) run in the sandbox's own
	// container before one, PostRestore the one run there after a restore,
	// before any task takes a container over.
	CheckpointTo, PreCheckpoint, PostRestore string
	// Tenant is the namespace whose stores and keys the sandbox may use.
	Tenant string
	// FitsPod says whether a snapshot's VM of this size is what the pod
	// asks for (nil: any size the node allows): a restore checks it before
	// it fetches anything.
	FitsPod func(vcpus, memoryMiB int) error
}

// Info describes a running sandbox.
type Info struct {
	ID           string
	QEMUPid      int
	BootID       string
	RestoredFrom string
	// RootDisk is the root disk the VM booted with (zero for a restored
	// VM, whose disks are in its record).
	RootDisk Disk
}

// Disk is a container's root disk as the guest and the task service name
// it: its device id (what RemoveRootDisk takes) and the virtio-blk serial
// the guest finds it by.
type Disk struct {
	ID, Serial string
}

// Sandbox is one VM and the agent connection into it.
type Sandbox struct {
	spec   Spec
	vm     *vmm.Machine
	agent  agentConn
	info   guestInfo
	rootfs *rootfsBuilder
	// root is the root disk attached at boot (a restored VM's disks are in
	// its record).
	root vmm.Disk
	// restoredFrom is the snapshot the sandbox was restored from, if any;
	// releaseSnapshot ends the sandbox's use of its materialized files.
	restoredFrom    string
	releaseSnapshot func()
	// guestID is the guest id of the sandbox's own container (the pod's
	// pause container, a lone container's task): the sandbox's id when it
	// booted, the checkpointed one's when it was restored, whose container
	// it took over under that id. A record names it so that every later
	// generation's first task finds its twin.
	guestID string
	// mem is the guest RAM: owned, private or served (guestmem.go).
	mem guestMemory
	// net is the pod network bridged to the VM's NIC; nil without one.
	net *podNetwork
	run runState
}

// Guest returns the guest agent. The end of the first exec it reports
// tells a lazily restored sandbox that it answered its first request: its
// background prefetch may take the link now.
func (s *Sandbox) Guest() Guest { return interactingGuest{Guest: s.agent, mem: s.mem} }

// interactingGuest is the guest agent noting an exec's end to the guest
// memory, so that the shim need not say when the sandbox interacted.
type interactingGuest struct {
	Guest
	mem guestMemory
}

func (g interactingGuest) Wait(ctx context.Context, containerID, execID string) (uint32, time.Time, error) {
	status, at, err := g.Guest.Wait(ctx, containerID, execID)
	if err == nil && execID != "" {
		g.mem.interacted()
	}
	return status, at, err
}

// Info describes the sandbox.
func (s *Sandbox) Info() Info {
	return Info{ID: s.spec.ID, QEMUPid: s.vm.Pid(), BootID: s.info.BootID, RestoredFrom: s.restoredFrom,
		RootDisk: Disk{ID: s.root.ID, Serial: s.root.Serial}}
}

// Done is closed when the VM has exited (QEMU killed, crashed or shut
// down); Err then says why, when the sandbox knows.
func (s *Sandbox) Done() <-chan struct{} { return s.vm.Exited() }

// Err is why the VM had to stop, when the sandbox knows: the first page of
// a lazily restored sandbox that could not be fetched or verified (it names
// the chunk and the store). It is nil otherwise, and before Done.
func (s *Sandbox) Err() error { return s.mem.failure() }

// logExit logs what QEMU wrote to its stderr once it exits: the task
// service learns of the exit through Done, the reason a person reads here.
func (s *Sandbox) logExit(ctx context.Context) {
	l := log.G(ctx)
	go func() {
		<-s.vm.Exited()
		l.WithField("stderr", s.vm.Stderr()).Info("qemu exited")
	}()
}

// RootSpec names a container's root filesystem: containerd's mounts, made
// into a disk in WorkDir.
type RootSpec struct {
	ContainerID, Bundle, WorkDir string
	Mounts                       []*types.Mount
}

// AddRootDisk makes a container's root disk and hot-plugs it.
func (s *Sandbox) AddRootDisk(ctx context.Context, r RootSpec) (Disk, error) {
	d, err := s.rootfs.disk(ctx, r.ContainerID, r.Bundle, r.WorkDir, r.Mounts)
	if err != nil {
		return Disk{ID: d.ID, Serial: d.Serial}, err
	}
	if err := s.vm.HotplugDisk(ctx, d); err != nil {
		return Disk{ID: d.ID, Serial: d.Serial}, fmt.Errorf("hot-plug root disk of %s: %w", r.ContainerID, err)
	}
	return Disk{ID: d.ID, Serial: d.Serial}, nil
}

// RemoveRootDisk unplugs a hot-plugged root disk.
func (s *Sandbox) RemoveRootDisk(ctx context.Context, id string) error {
	return s.vm.UnplugDisk(ctx, id)
}

// Stop kills the VM within a few seconds; its processes end with it.
func (s *Sandbox) Stop(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	if err := s.vm.Shutdown(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("stop sandbox vm")
	}
	s.run.set(vmStopped)
}

// Pause stops the VM's vCPUs.
func (s *Sandbox) Pause(ctx context.Context) error {
	if err := s.vm.Pause(ctx); err != nil {
		return fmt.Errorf("pause vm: %w", err)
	}
	s.run.set(vmPaused)
	return nil
}

// Resume lets a paused VM run again.
func (s *Sandbox) Resume(ctx context.Context) error {
	if err := s.vm.Resume(ctx); err != nil {
		return fmt.Errorf("resume vm: %w", err)
	}
	s.run.set(vmRunning)
	return nil
}

func newRootfsBuilder(o RootFSOptions) *rootfsBuilder {
	return &rootfsBuilder{cacheDir: o.ImageCache, writableMiB: o.WritableDiskMiB}
}

// connectAgent dials the agent's virtio-serial port and waits for it to
// answer, within ac's dial timeout; the client's short calls then get ac's
// request timeout. A VM that dies meanwhile ends the wait at once with
// QEMU's own stderr and the tail of the guest console.
func connectAgent(ctx context.Context, vm machine, ac AgentTimeouts) (agentConn, guestInfo, error) {
	timeout := ac.Dial
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	go func() {
		select {
		case <-vm.Exited():
			cancel()
		case <-ctx.Done():
		}
	}()
	var lastErr error
	start, attempts := time.Now(), 0
	for ctx.Err() == nil {
		conn, err := vm.DialAgent(ctx)
		if err != nil {
			lastErr = err
			break
		}
		ag := newAgentClient(conn, ac.Request)
		pctx, pcancel := context.WithTimeout(ctx, agentPingTimeout)
		info, err := ag.ping(pctx)
		pcancel()
		if err == nil {
			log.G(ctx).WithFields(log.Fields{"attempts": attempts + 1, "duration": time.Since(start)}).Debug("guest agent answered")
			return ag, info, nil
		}
		ag.close()
		attempts++
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-vm.Exited():
		return nil, guestInfo{}, fmt.Errorf("vm exited before its agent answered: %s; console: %s", vm.Stderr(), consoleTail(vm.ConsolePath()))
	default:
	}
	if lastErr == nil {
		lastErr = ctx.Err()
	}
	return nil, guestInfo{}, fmt.Errorf("guest agent did not answer within %s: %w; console: %s", timeout, lastErr, consoleTail(vm.ConsolePath()))
}

// consoleTail is the end of a guest console log, read without the rest: the
// guest wrote it, up to its cap.
func consoleTail(path string) string {
	if s := vmm.ConsoleTail(path, 2000); s != "" {
		return s
	}
	return "(no console log)"
}

// confined applies the node's QEMU confinement and console cap to c.
func confined(c vmm.Config, t VMTemplate) vmm.Config {
	c.Confine = t.Confine
	c.PrivateMemoryDir = t.MemoryDir
	c.ConsoleMaxBytes = t.ConsoleMaxBytes
	return c
}

// Shutdown stops the VM and removes the sandbox state. It is idempotent.
func (s *Sandbox) Shutdown(ctx context.Context) error {
	if s.agent != nil {
		s.agent.close()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	// QEMU first: it maps the served RAM until it is gone.
	err := s.vm.Shutdown(ctx)
	s.run.set(vmStopped)
	if rerr := s.mem.close(ctx, err); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if s.releaseSnapshot != nil && err == nil {
		s.releaseSnapshot() // QEMU is gone; closing twice is harmless
	}
	s.net.teardown(ctx)
	for _, dir := range []string{s.spec.StateDir, s.spec.DiskDir} {
		if dir == "" {
			continue
		}
		if rerr := os.RemoveAll(dir); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

// Cleanup ends what a sandbox whose shim died left running in stateDir and
// removes it, for `shim delete`: its QEMU killed (vmm.Cleanup), then its
// served RAM unmounted (servedram.Cleanup: QEMU mapped it until it was
// gone), then the directory. A step that fails does not stop the next.
func Cleanup(stateDir string) error {
	var errs []error
	if err := vmm.Cleanup(stateDir); err != nil {
		errs = append(errs, fmt.Errorf("clean up vm: %w", err))
	}
	if err := servedram.Cleanup(stateDir); err != nil {
		errs = append(errs, fmt.Errorf("clean up served ram: %w", err))
	}
	if err := os.RemoveAll(stateDir); err != nil {
		errs = append(errs, fmt.Errorf("remove sandbox state %s: %w", stateDir, err))
	}
	return errors.Join(errs...)
}

// ramPath names the guest RAM file of the sandbox whose state is in
// stateDir. The name hashes the whole state dir path: sandboxes of
// different containerd instances (and state roots) on one host must never
// share a RAM file.
func ramPath(memoryDir, stateDir string) string { return memoryFile(memoryDir, stateDir, ".ram") }

// layerPath names the RAM layer of a lazily restored sandbox whose state
// is in stateDir (servedram.Options.Layer).
func layerPath(memoryDir, stateDir string) string { return memoryFile(memoryDir, stateDir, ".layer") }

// memoryFile names a sandbox's file in the memory dir by a hash of its
// whole state dir path, with suffix ext.
func memoryFile(memoryDir, stateDir, ext string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return filepath.Join(memoryDir, "cryo-"+hex.EncodeToString(sum[:8])+ext)
}
