package sandbox

import "sync"

// vmState is what the VM does, as the sandbox's callers asked for it:
// running, paused through Pause (a checkpoint leaves such a VM stopped), or
// stopped for good. A checkpoint's own pause window is not a state: it
// ends before Checkpoint returns.
type vmState int

const (
	vmRunning vmState = iota
	vmPaused
	vmStopped
)

func (s vmState) String() string { return [...]string{"running", "paused", "stopped"}[s] }

// runState holds the VM's state and whether a checkpoint is in progress.
type runState struct {
	mu            sync.Mutex
	state         vmState
	checkpointing bool
}

func (r *runState) get() vmState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// set records a new state; a stopped VM stays stopped.
func (r *runState) set(s vmState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != vmStopped {
		r.state = s
	}
}

// beginCheckpoint claims the VM for one checkpoint and returns its state,
// or false when a checkpoint is already in progress.
func (r *runState) beginCheckpoint() (vmState, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checkpointing {
		return r.state, false
	}
	r.checkpointing = true
	return r.state, true
}

func (r *runState) endCheckpoint() {
	r.mu.Lock()
	r.checkpointing = false
	r.mu.Unlock()
}
