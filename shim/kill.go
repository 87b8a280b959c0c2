package shim

import (
	"context"
	"fmt"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// kill signals a process in the guest; a SIGKILL that the guest cannot
// take, or does not act on within killGrace, stops the VM instead.
func (s *service) kill(ctx context.Context, c *container, p *process, sig uint32, all bool) error {
	if done, err := s.killUnstarted(c, p, sig); done {
		return err
	}
	sb := s.sb
	if s.vmPaused.Load() {
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

// killUnstarted ends an init that has not started (nothing runs yet: it
// ends without ever starting), and refuses an exec that has not started or
// a process that has finished, as runc's shim; done is false for a process
// that runs.
func (s *service) killUnstarted(c *container, p *process, sig uint32) (done bool, _ error) {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	switch p.current() {
	case stateStopped, stateDeleted:
		return true, fmt.Errorf("process %s already finished: %w", p.name(), errdefs.ErrNotFound)
	case stateCreated:
		if p.execID != "" {
			// runc starts an exec at Start: before it there is no
			// process to signal, and no exit to report.
			return true, fmt.Errorf("process %s not created: %w", p.name(), errdefs.ErrFailedPrecondition)
		}
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
	s.vmPaused.Store(false)
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
	case <-sb.Done():
	case <-t.C:
		log.G(ctx).WithField("id", c.id).Warnf("no exit from the guest %s after SIGKILL: stopping the sandbox vm", grace)
		sb.Stop(ctx)
	}
}
