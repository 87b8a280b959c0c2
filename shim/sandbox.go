package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

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
	net      *podNetwork // nil without a pod network

	mu     sync.Mutex
	paused bool
}

// bootSandbox starts the VM with the first container's root disk attached
// and connects to its agent. On failure nothing is left running.
func bootSandbox(ctx context.Context, id string, cfg configs.Config, stateDir string, sz vmSize, disks []vmm.Disk, pn *podNetwork) (_ *sandbox, retErr error) {
	start := time.Now()
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create sandbox state dir: %w", err)
	}
	h := cfg.Hypervisor
	vm, err := vmm.New(vmm.Config{
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
		MemoryPath:   filepath.Join(h.MemoryDir, "cryo-"+filepath.Base(stateDir)+".ram"),
		MemoryShared: true,
		Disks:        disks,
		NICs:         pn.nics(),
		HotplugPorts: h.HotplugPorts,
		VMGenID:      true,
	})
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
	ag, info, err := connectAgent(ctx, vm, cfg.Agent.DialTimeout.Duration)
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
// answer, within timeout. A VM that dies meanwhile ends the wait at once with
// QEMU's own stderr and the tail of the guest console.
func connectAgent(ctx context.Context, vm *vmm.Machine, timeout time.Duration) (guestAgent, guestInfo, error) {
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
	for ctx.Err() == nil {
		conn, err := vm.DialAgent(ctx)
		if err != nil {
			lastErr = err
			break
		}
		ag := newAgentClient(conn, 0)
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := ag.ping(pctx)
		pcancel()
		if err == nil {
			return ag, info, nil
		}
		ag.close()
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

func consoleTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no console log)"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// shutdown stops the VM and removes the sandbox state. It is idempotent.
func (s *sandbox) shutdown(ctx context.Context) error {
	if s.agent != nil {
		s.agent.close()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	err := s.vm.Shutdown(ctx)
	s.net.teardown(ctx)
	if rerr := os.RemoveAll(s.stateDir); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

type vmSize struct {
	vcpus, memoryMiB int
}
