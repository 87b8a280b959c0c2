package shim

import (
	"context"
	"encoding/json"
	"fmt"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// startProcess starts a created process in the guest.
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

// execProcess creates an exec of a running container in the guest, with
// its streams.
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
