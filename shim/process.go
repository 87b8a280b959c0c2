package shim

import (
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
)

// procState is a process's lifecycle state. Transitions are explicit; an
// invalid one is errdefs.ErrFailedPrecondition, as in the runc shim's
// init_state.go.
type procState int

const (
	stateCreated procState = iota
	stateRunning
	statePaused
	stateStopped
	stateDeleted
)

func (s procState) String() string {
	return [...]string{"created", "running", "paused", "stopped", "deleted"}[s]
}

// allowed lists the transitions of the state machine.
var allowed = map[procState][]procState{
	stateCreated: {stateRunning, stateStopped, stateDeleted},
	stateRunning: {statePaused, stateStopped},
	statePaused:  {stateRunning, stateStopped},
	stateStopped: {stateDeleted},
}

// process is one process in the guest: a container's init (execID "") or an
// exec.
type process struct {
	containerID string
	execID      string
	stdio       stdio

	mu         sync.Mutex
	state      procState
	pid        uint32
	exitStatus uint32
	exitedAt   time.Time
	exited     chan struct{}
	io         *procIO
}

type stdio struct {
	stdin, stdout, stderr string
	terminal              bool
}

func newProcess(containerID, execID string, s stdio) *process {
	return &process{containerID: containerID, execID: execID, stdio: s, exited: make(chan struct{})}
}

func (p *process) name() string {
	if p.execID == "" {
		return p.containerID
	}
	return p.containerID + "/" + p.execID
}

// transition moves the process to state to, or fails with
// ErrFailedPrecondition naming both states.
func (p *process) transition(to procState) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.transitionLocked(to)
}

func (p *process) transitionLocked(to procState) error {
	for _, s := range allowed[p.state] {
		if s == to {
			p.state = to
			return nil
		}
	}
	return fmt.Errorf("process %s is %s, cannot become %s: %w", p.name(), p.state, to, errdefs.ErrFailedPrecondition)
}

func (p *process) current() procState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

func (p *process) setPid(pid uint32) {
	p.mu.Lock()
	p.pid = pid
	p.mu.Unlock()
}

func (p *process) getPid() uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// setExited records the exit once; it reports false if the process had
// exited already.
func (p *process) setExited(status uint32, at time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == stateStopped || p.state == stateDeleted {
		return false
	}
	p.state = stateStopped
	p.exitStatus, p.exitedAt = status, at
	close(p.exited)
	return true
}

func (p *process) exit() (uint32, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitStatus, p.exitedAt
}

func (p *process) status() task.Status {
	switch p.current() {
	case stateCreated:
		return task.Status_CREATED
	case stateRunning:
		return task.Status_RUNNING
	case statePaused:
		return task.Status_PAUSED
	default:
		return task.Status_STOPPED
	}
}
