package sandbox

import (
	"context"
	"errors"
	"testing"
)

// stoppedRAM is a guest memory whose server stopped the VM.
type stoppedRAM struct {
	ownedMemory
	err error
}

func (m *stoppedRAM) failure() error { return m.err }

// TestStartSaysWhyTheVMStopped: a start whose VM its served RAM stopped
// (here before the agent answered) fails with the RAM's reason (the chunk
// and the store) after the step's error; other failures are unchanged.
func TestStartSaysWhyTheVMStopped(t *testing.T) {
	exited := errors.New("vm exited before its agent answered")
	st := &start{vms: vmFactory{connect: func(context.Context, machine, AgentTimeouts) (agentConn, guestInfo, error) {
		return nil, guestInfo{}, exited
	}}}
	steps := []step{{"connect agent", st.connectAgent}}
	reason := errors.New("lazy restore from file:///store: chunk sha256:abcd: digest mismatch")
	st.mem = &stoppedRAM{err: reason}
	err := st.run(t.Context(), "restore", steps)
	if want := "restore: connect agent: " + exited.Error() + ": the sandbox vm stopped: " + reason.Error(); err == nil || !errors.Is(err, exited) || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
	for _, mem := range []guestMemory{&stoppedRAM{}, nil} {
		st.mem = mem
		if err := st.run(t.Context(), "restore", steps); err == nil || err.Error() != "restore: connect agent: "+exited.Error() {
			t.Fatalf("memory %T that did not stop the vm: error %v, want the step's error alone", mem, err)
		}
	}
}
