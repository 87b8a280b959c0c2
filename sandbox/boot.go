package sandbox

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/log"

	"github.com/cryo-runtime/cryo/network"
	"github.com/cryo-runtime/cryo/sandbox/servedram"
	"github.com/cryo-runtime/cryo/vmm"
)

// start is one sandbox on its way to a running guest: Boot and Restore
// run the same kind of step list, Restore swapping the boot's steps for
// its own (as firecracker-go-sdk's WithSnapshot swaps its handlers). The
// fields are what the steps made so far.
type start struct {
	Spec
	root  RootSpec
	src   Source
	vmcfg vmm.Config
	pn    *podNetwork
	mem   guestMemory
	vm    machine
	agent agentConn
	info  guestInfo
	// set by restore's steps
	restore *restoring
	// vms makes the machine and the agent connection: QEMU's, or fakes
	// in the step tests.
	vms vmFactory
}

// Boot starts a new VM with the first container's root disk attached and
// connects to its agent. On failure nothing is left running.
func Boot(ctx context.Context, spec Spec, root RootSpec) (*Sandbox, error) {
	st := &start{Spec: spec, root: root, vms: qemuFactory}
	sb := &Sandbox{spec: spec, rootfs: newRootfsBuilder(spec.Node.RootFS), guestID: spec.ID}
	if err := st.run(ctx, "boot", st.bootSteps(sb)); err != nil {
		return nil, err
	}
	log.G(ctx).WithFields(log.Fields{
		"qemu_pid": st.vm.Pid(), "boot_id": st.info.BootID, "kernel": st.info.Kernel,
	}).Info("sandbox vm booted")
	return st.finish(ctx, sb), nil
}

// bootSteps are a boot's steps; the root disk goes to sb.
func (st *start) bootSteps(sb *Sandbox) []step {
	return []step{
		{"state dir", st.stateDir},
		{"root disk", func(ctx context.Context, _ *undo) (err error) {
			sb.root, err = sb.rootfs.disk(ctx, st.root.ContainerID, st.root.Bundle, st.root.WorkDir, st.root.Mounts)
			return err
		}},
		{"pod network", st.network(network.Options{})},
		{"guest ram", st.bootRAM},
		{"vm config", func(ctx context.Context, _ *undo) error { return st.bootConfig(ctx, sb.root) }},
		{"vm", st.newVM},
		{"qemu", func(ctx context.Context, u *undo) error {
			if err := st.startQEMU(ctx, u); err != nil {
				return err
			}
			st.mem.started(st.vm)
			return nil
		}},
		{"agent", st.connectAgent},
		{"guest network", st.guestNetwork},
	}
}

// finish hands what the steps made to the sandbox, whose VM is QEMU's
// (Boot and Restore make their machines with qemuFactory).
func (st *start) finish(ctx context.Context, sb *Sandbox) *Sandbox {
	sb.vm, sb.mem, sb.agent, sb.info, sb.net = st.vm.(*vmm.Machine), st.mem, st.agent, st.info, st.pn
	sb.logExit(ctx)
	return sb
}

func (st *start) stateDir(ctx context.Context, _ *undo) error {
	if err := os.MkdirAll(st.StateDir, 0o700); err != nil {
		return fmt.Errorf("create sandbox state dir: %w", err)
	}
	return nil
}

// network bridges the pod's netns to a tap for the VM's NIC.
func (st *start) network(opts network.Options) func(context.Context, *undo) error {
	return func(ctx context.Context, u *undo) error {
		pn, err := setupNetwork(ctx, st.Pod, opts)
		if err != nil {
			return err
		}
		st.pn = pn
		u.onFailure(pn.teardown)
		return nil
	}
}

// bootConfig is a new VM of the requested size with root attached.
func (st *start) bootConfig(ctx context.Context, root vmm.Disk) error {
	t := st.Node.VM
	c := t.config(st.ID, st.StateDir)
	c.VCPUs, c.MemoryMiB = st.VCPUs, st.MemoryMiB
	c.Disks, c.NICs, c.HotplugPorts = []vmm.Disk{root}, st.pn.nics(), t.HotplugPorts
	st.mem.configure(&c)
	if g, err := hostGuestDigests(st.Node); err == nil {
		c = g.apply(c)
	} else {
		log.G(ctx).WithError(err).Debug("guest file digests from host facts; the vm hashes the files")
	}
	st.vmcfg = confined(c, t)
	return nil
}

// bootRAM is the new VM's RAM: a tmpfs file it owns, or, when the node
// serves booted RAM ([memory] booted = "served"), a pagefs file served
// from zeros whose checkpoint seals what the guest wrote instead of
// copying the RAM in the pause. A RAM that cannot be served falls back to
// an owned file: the sandbox boots either way.
func (st *start) bootRAM(ctx context.Context, u *undo) error {
	t := st.Node.VM
	if t.ServedRAM {
		ram, err := servedram.ServeZero(ctx, int64(st.MemoryMiB)<<20, servedram.Options{
			StateDir: st.StateDir, Layer: layerPath(t.MemoryDir, st.StateDir),
			PageTimeout: st.Node.Lazy.PageTimeout, StuckGrace: stuckGrace,
		})
		if err == nil {
			// Pushed before QEMU's shutdown: the undo stack kills QEMU first.
			u.onFailure(func(ctx context.Context) {
				if err := ram.Close(ctx); err != nil {
					log.G(ctx).WithError(err).Warn("boot: unmount served ram")
				}
			})
			st.mem = &servedMemory{ram: ram, booted: true}
			return nil
		}
		log.G(ctx).WithError(err).Warn("booted ram cannot be served ([memory] booted = \"served\"): an owned file")
	}
	st.mem = &ownedMemory{path: ramPath(t.MemoryDir, st.StateDir)}
	return nil
}

// newVM checks the VM's configuration and makes its machine.
func (st *start) newVM(ctx context.Context, _ *undo) (err error) {
	st.vm, err = st.vms.newMachine(st.vmcfg)
	return err
}

// startQEMU starts QEMU (paused for an incoming state on a restore).
func (st *start) startQEMU(ctx context.Context, u *undo) error {
	vm := st.vm
	if err := vm.Start(ctx); err != nil {
		return err
	}
	u.onFailure(func(ctx context.Context) {
		sctx, cancel := context.WithTimeout(ctx, failedStartTimeout)
		defer cancel()
		_ = vm.Shutdown(sctx)
	})
	return nil
}

func (st *start) connectAgent(ctx context.Context, u *undo) error {
	ag, info, err := st.vms.connect(ctx, st.vm, st.Node.Agent)
	if err != nil {
		return err
	}
	st.agent, st.info = ag, info
	u.onFailure(func(context.Context) { ag.close() })
	return nil
}

// guestNetwork gives the guest NIC the pod's MAC, addresses and routes.
func (st *start) guestNetwork(ctx context.Context, _ *undo) error {
	return st.pn.configureGuest(ctx, st.agent)
}

// run runs a boot's or a restore's steps. A VM that its served RAM stopped
// (a lazy restore's page or prefetch that met a bad chunk) fails with the
// RAM's reason, which names the chunk and the store, whichever step met
// the stopped VM ("vm exited before its agent answered", a lost QMP or
// agent connection).
func (st *start) run(ctx context.Context, what string, steps []step) error {
	err := runSteps(ctx, what, steps)
	if err == nil || st.mem == nil {
		return err
	}
	if stopped := st.mem.failure(); stopped != nil {
		return fmt.Errorf("%w: the sandbox vm stopped: %v", err, stopped)
	}
	return err
}
