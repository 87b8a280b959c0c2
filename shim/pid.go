package shim

import (
	"context"

	"github.com/containerd/log"
)

// Pids under cryo. containerd and its users take a task's pid for a host
// pid: they kill it, look up its cgroup, enter its namespaces. A guest
// process has no host pid, and its guest pid names some unrelated host
// process, so every task and exec of the sandbox reports the pid of its
// VM, QEMU, as Kata reports its hypervisor's: a kill or a cgroup lookup
// by pid reaches the sandbox and nothing else. Killing that pid kills
// the VM, and with it every container of the pod (monitor reports their
// exits). Signals to one container go through the agent by container
// and exec id, never by pid. The guest pid is kept for the logs only.

// taskPid is the pid containerd is told for p: the VM's, once p exists in
// the guest. An exec that never started has none (0), as runc's.
func (s *service) taskPid(p *process) uint32 {
	if p.execID != "" && p.getGuestPid() == 0 {
		return 0
	}
	return s.vmPid()
}

// vmPid is QEMU's pid, 0 before the sandbox exists. It stays QEMU's after
// the VM exited, as a process's pid does after its exit.
func (s *service) vmPid() uint32 {
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb == nil {
		return 0
	}
	return uint32(sb.Info().QEMUPid)
}

// recordTaskPid writes pid, what containerd was told for c, into its
// bundle, for the exit and delete events that `shim delete` publishes after
// the shim died: containerd expects them to carry the task's pid.
func (s *service) recordTaskPid(ctx context.Context, c *container, pid uint32) {
	if err := writePidRecord(c.bundle, pid); err != nil {
		log.G(ctx).WithError(err).WithField("id", c.id).Warn("record task pid in bundle")
	}
}
