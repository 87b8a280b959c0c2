package shim

import (
	"errors"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
)

func TestProcessTransitions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []procState
		ok    bool
	}{
		{"normal", []procState{stateRunning, stateStopped, stateDeleted}, true},
		{"pause", []procState{stateRunning, statePaused, stateRunning, stateStopped}, true},
		{"delete created", []procState{stateDeleted}, true},
		{"start twice", []procState{stateRunning, stateRunning}, false},
		{"delete running", []procState{stateRunning, stateDeleted}, false},
		{"pause created", []procState{statePaused}, false},
		{"restart stopped", []procState{stateRunning, stateStopped, stateRunning}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProcess("c", "", stdio{})
			var err error
			for _, s := range tc.steps {
				if err = p.transition(s); err != nil {
					break
				}
			}
			if tc.ok && err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if !tc.ok && !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("error = %v, want ErrFailedPrecondition", err)
			}
		})
	}
}

func TestProcessExitOnce(t *testing.T) {
	p := newProcess("c", "e1", stdio{})
	if err := p.transition(stateRunning); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if !p.setExited(3, at) {
		t.Fatal("first exit not recorded")
	}
	if p.setExited(137, time.Now()) {
		t.Fatal("second exit recorded")
	}
	select {
	case <-p.exited:
	default:
		t.Fatal("exited channel not closed")
	}
	if st, when := p.exit(); st != 3 || !when.Equal(at) {
		t.Fatalf("exit = %d %v", st, when)
	}
	if p.status() != task.Status_STOPPED || p.name() != "c/e1" {
		t.Fatalf("status %v name %s", p.status(), p.name())
	}
}
