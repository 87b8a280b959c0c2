package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
)

// exitKilled is the status of processes that die with their VM.
const exitKilled = 128 + uint32(unix.SIGKILL)

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
	<-sb.Done()
	s.vmPaused.Store(false)
	failure := sb.Err()
	l := log.G(s.ctx)
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
	case <-sb.Done():
		return sb.Err(), true
	default:
	}
	if wait <= 0 {
		return nil, false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-sb.Done():
		return sb.Err(), true
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

// watchOOM publishes a TaskOOM for each process the guest's OOM killer
// takes from container c, as runc's shim does from the same cgroup file
// (CRI marks the container OOMKilled by it, also when the killed process
// was not its main one). It ends when the container is removed, the VM
// stops or the guest's agent predates WaitOOM (a restored guest).
func (s *service) watchOOM(c *container) {
	ctx := log.WithLogger(s.ctx, log.G(s.ctx).WithField("id", c.id))
	var seen uint64
	for {
		n, err := s.sb.Guest().WaitOOM(ctx, c.guestID, seen)
		if err != nil {
			log.G(ctx).WithError(err).Debug("stopped watching OOM kills")
			return
		}
		log.G(ctx).WithField("oom_kills", n).Info("the guest's OOM killer took a process of the container")
		seen = n
		s.send(&eventstypes.TaskOOM{ContainerID: c.id})
	}
}
