package shim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/vmm"
)

// guestAgent is what the shim needs from the guest agent; agentClient in
// guest.go implements it over the ttrpc API.
type guestAgent interface {
	stdioGuest
	ping(ctx context.Context) (guestInfo, error)
	createContainer(ctx context.Context, r createRequest) error
	startProcess(ctx context.Context, containerID, execID string) (uint32, error)
	execProcess(ctx context.Context, containerID, execID string, p *specs.Process, s stdio) error
	signal(ctx context.Context, containerID, execID string, sig uint32, all bool) error
	wait(ctx context.Context, containerID, execID string) (uint32, time.Time, error)
	resize(ctx context.Context, containerID, execID string, w, h uint32) error
	pids(ctx context.Context, containerID string) ([]uint32, error)
	stats(ctx context.Context, containerID string) (*anypb.Any, error)
	removeContainer(ctx context.Context, containerID string) error
	deleteProcess(ctx context.Context, containerID, execID string) error
	sync(ctx context.Context) error
	runHook(ctx context.Context, containerID string, argv []string, timeout time.Duration) (string, int, error)
	fixUpRestored(ctx context.Context) error
	listContainers(ctx context.Context) ([]*agentapi.ContainerInfo, error)
	close() error
}

type guestInfo struct {
	BootID, Kernel string
}

// createRequest describes a container for the guest.
type createRequest struct {
	ID     string
	Spec   *specs.Spec
	Serial string // virtio-blk serial of the root disk
	Files  []guestFile
	Stdio  stdio
}

// guestFile is a small host file copied into the container: a VM cannot
// bind-mount host paths.
type guestFile struct {
	Path    string
	Content []byte
	Mode    os.FileMode
}

// sandbox is one VM and the agent connection into it.
type sandbox struct {
	id       string
	bundle   string // the bundle of the container that booted the VM
	cfg      configs.Config
	stateDir string
	vm       *vmm.Machine
	agent    guestAgent
	info     guestInfo
	rootfs   *rootfsBuilder
	// diskDir holds the sandbox's writable disks (qcow2 overlays) on disk,
	// not on the tmpfs that holds bundles and state.
	diskDir string
	// req is what the sandbox's annotations asked for; annotations are the
	// sandbox container's.
	req         annotations.Request
	annotations map[string]string
	// restoredFrom is the snapshot the sandbox was restored from, if any;
	// releaseSnapshot ends the sandbox's use of its materialized files.
	restoredFrom    string
	releaseSnapshot func()
	// net is the pod network bridged to the VM's NIC; nil without one.
	net *podNetwork

	checkpointing atomic.Bool
	// ext serves the shim's own API (cryoctl) on the state dir.
	ext *ttrpc.Server
}

// bootSandbox starts the VM with the first container's root disk attached
// and connects to its agent. On failure nothing is left running.
func bootSandbox(ctx context.Context, id string, cfg configs.Config, stateDir string, sz vmSize, disks []vmm.Disk, pn *podNetwork) (_ *sandbox, retErr error) {
	start := time.Now()
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create sandbox state dir: %w", err)
	}
	h := cfg.Hypervisor
	vmcfg := vmm.Config{
		ID:           id,
		StateDir:     stateDir,
		QEMUPath:     h.Path,
		Kernel:       h.Kernel,
		Initrd:       h.Initrd,
		KernelArgs:   h.KernelArgs,
		MachineType:  h.MachineType,
		CPUModel:     h.CPUModel,
		Accel:        h.Accel,
		VCPUs:        sz.vcpus,
		MemoryMiB:    sz.memoryMiB,
		MemoryPath:   ramPath(h.MemoryDir, stateDir),
		MemoryShared: true,
		Disks:        disks,
		NICs:         pn.nics(),
		HotplugPorts: h.HotplugPorts,
		VMGenID:      true,
	}
	vmcfg = confined(vmcfg, cfg)
	if g, err := hostGuestDigests(cfg); err == nil {
		vmcfg = g.apply(vmcfg)
	} else {
		log.G(ctx).WithError(err).Debug("guest file digests from host facts; the vm hashes the files")
	}
	vm, err := vmm.New(vmcfg)
	if err != nil {
		return nil, err
	}
	if err := vm.Start(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = vm.Shutdown(sctx)
		}
	}()
	ag, info, err := connectAgent(ctx, vm, cfg.Agent)
	if err != nil {
		return nil, err
	}
	if err := pn.configureGuest(ctx, ag); err != nil {
		ag.close()
		return nil, err
	}
	log.G(ctx).WithFields(log.Fields{
		"qemu_pid": vm.Pid(), "boot_id": info.BootID, "kernel": info.Kernel, "duration": time.Since(start),
	}).Info("sandbox vm booted")
	return &sandbox{
		id: id, cfg: cfg, stateDir: stateDir, vm: vm, agent: ag, info: info, net: pn,
		rootfs: &rootfsBuilder{cacheDir: cfg.Runtime.ImageCache, writableMiB: cfg.Runtime.WritableDiskMiB},
	}, nil
}

// connectAgent dials the agent's virtio-serial port and waits for it to
// answer, within ac's dial timeout; the client's short calls then get ac's
// request timeout. A VM that dies meanwhile ends the wait at once with
// QEMU's own stderr and the tail of the guest console.
func connectAgent(ctx context.Context, vm *vmm.Machine, ac configs.Agent) (guestAgent, guestInfo, error) {
	timeout := ac.DialTimeout.Duration
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
		ag := newAgentClient(conn, ac.RequestTimeout.Duration)
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
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
func confined(c vmm.Config, cfg configs.Config) vmm.Config {
	h := cfg.Hypervisor
	c.Confine = vmm.Confinement{
		Disabled: !h.ConfineQEMU,
		UIDBase:  h.QEMUUIDBase, UIDCount: h.QEMUUIDCount,
		LockDir: cfg.Runtime.QEMUUIDLockDir(),
	}
	c.PrivateMemoryDir = h.MemoryDir
	c.ConsoleMaxBytes = int64(h.ConsoleLogKiB) << 10
	return c
}

// shutdown stops the VM and removes the sandbox state. It is idempotent.
func (s *sandbox) shutdown(ctx context.Context) error {
	if s.ext != nil {
		s.ext.Close()
	}
	if s.agent != nil {
		s.agent.close()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	err := s.vm.Shutdown(ctx)
	if s.releaseSnapshot != nil && err == nil {
		s.releaseSnapshot() // QEMU is gone; closing twice is harmless
	}
	s.net.teardown(ctx)
	for _, dir := range []string{s.stateDir, s.diskDir} {
		if dir == "" {
			continue
		}
		if rerr := os.RemoveAll(dir); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

type vmSize struct {
	vcpus, memoryMiB int
}

// ramPath names the guest RAM file of the sandbox whose state is in
// stateDir. The name hashes the whole state dir path: sandboxes of
// different containerd instances (and state roots) on one host must never
// share a RAM file.
func ramPath(memoryDir, stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return filepath.Join(memoryDir, "cryo-"+hex.EncodeToString(sum[:8])+".ram")
}
