package shim

import (
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/sandbox"
)

// procState is a process's lifecycle state. Transitions are explicit; an
// invalid one is errdefs.ErrFailedPrecondition, as in the runc shim's
// init_state.go.
type procState int

const (
	stateCreated procState = iota
	// stateCreatedCheckpoint is the init of a container that a restore
	// brought back (runc's createdCheckpointState): it has run in the
	// guest since before the checkpoint, and Start only takes it over.
	stateCreatedCheckpoint
	stateRunning
	statePaused
	stateStopped
	stateDeleted
)

func (s procState) String() string {
	return [...]string{"created", "created from checkpoint", "running", "paused", "stopped", "deleted"}[s]
}

// allowed lists the transitions of the state machine.
var allowed = map[procState][]procState{
	stateCreated:           {stateCreatedCheckpoint, stateRunning, stateStopped, stateDeleted},
	stateCreatedCheckpoint: {stateRunning, stateStopped, stateDeleted},
	stateRunning:           {statePaused, stateStopped},
	statePaused:            {stateRunning, stateStopped},
	stateStopped:           {stateDeleted},
}

// process is one process in the guest: a container's init (execID "") or an
// exec.
type process struct {
	containerID string
	execID      string
	stdio       stdio

	// startMu makes a start and a kill of a created process take turns.
	startMu sync.Mutex
	mu      sync.Mutex
	state   procState
	// guestPid is the process's pid in the guest, for the logs: what
	// containerd is told is the VM's pid (see service.taskPid).
	guestPid   uint32
	exitStatus uint32
	exitedAt   time.Time
	exited     chan struct{}
	io         *procIO
}

type stdio = sandbox.Stdio

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

func (p *process) setGuestPid(pid uint32) {
	p.mu.Lock()
	p.guestPid = pid
	p.mu.Unlock()
}

func (p *process) getGuestPid() uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.guestPid
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
	case stateCreated, stateCreatedCheckpoint:
		return task.Status_CREATED
	case stateRunning:
		return task.Status_RUNNING
	case statePaused:
		return task.Status_PAUSED
	default:
		return task.Status_STOPPED
	}
}

// start starts a created process with startInGuest and moves it to
// running; a restored init is running already and only changes state. A
// failed start leaves the process created.
func (p *process) start(startInGuest func() (uint32, error)) error {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	switch st := p.current(); st {
	case stateCreatedCheckpoint:
		return p.transition(stateRunning)
	case stateCreated:
	default:
		return fmt.Errorf("process %s is %s, cannot start: %w", p.name(), st, errdefs.ErrFailedPrecondition)
	}
	pid, err := startInGuest()
	if err != nil {
		return err
	}
	p.setGuestPid(pid)
	return p.transition(stateRunning)
}
