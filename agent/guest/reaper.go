package guest

import (
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Exit is how a process ended.
type Exit struct {
	Status int         // exit code, or 128+signal
	Signal unix.Signal // the signal that killed it, 0 if it exited
	At     time.Time
}

func exitFromWaitStatus(ws unix.WaitStatus) Exit {
	e := Exit{Status: ws.ExitStatus(), At: time.Now()}
	if ws.Signaled() {
		e.Status, e.Signal = 128+int(ws.Signal()), ws.Signal()
	}
	return e
}

// Reaper reaps every child of the agent (PID 1 of the guest: orphans included)
// and hands the exit of processes started through it to their callbacks. A
// process is registered under the same lock that reaping takes, so its exit can
// never be reaped before its callback is known; nothing else may wait for
// children (never call exec.Cmd.Wait).
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]func(Exit)
	// wait4 is unix.Wait4; a field so that tests can count calls.
	wait4 func(pid int, ws *unix.WaitStatus, options int, ru *unix.Rusage) (int, error)
}

// NewReaper returns a reaper; call Run to start reaping on SIGCHLD.
func NewReaper() *Reaper {
	return &Reaper{waiters: map[int]func(Exit){}, wait4: unix.Wait4}
}

// Run reaps on every SIGCHLD until stop is closed.
func (r *Reaper) Run(stop <-chan struct{}) {
	ch := make(chan os.Signal, 32)
	signal.Notify(ch, unix.SIGCHLD)
	defer signal.Stop(ch)
	r.Reap()
	for {
		select {
		case <-ch:
			r.Reap()
		case <-stop:
			return
		}
	}
}

// Reap collects every exited child without blocking.
func (r *Reaper) Reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := r.wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if f, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			go f(exitFromWaitStatus(ws))
		}
	}
}

// Start starts cmd and calls onExit (on its own goroutine) when it exits.
func (r *Reaper) Start(cmd *exec.Cmd, onExit func(Exit)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	r.waiters[cmd.Process.Pid] = onExit
	return nil
}
