package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// stoppedRAM is a guest memory whose server stopped the VM.
type stoppedRAM struct {
	ownedMemory
	err error
}

func (m *stoppedRAM) failure() error { return m.err }

// TestConnectAgentSaysWhyTheVMStopped: a VM its served RAM stopped before
// the agent answered fails the start with the RAM's reason (the chunk and
// the store), not only "vm exited"; other failures are unchanged.
func TestConnectAgentSaysWhyTheVMStopped(t *testing.T) {
	exited := errors.New("vm exited before its agent answered")
	st := &start{vms: vmFactory{connect: func(context.Context, machine, AgentTimeouts) (agentConn, guestInfo, error) {
		return nil, guestInfo{}, exited
	}}}
	reason := errors.New("lazy restore from file:///store: chunk sha256:abcd: digest mismatch")
	st.mem = &stoppedRAM{err: reason}
	err := st.connectAgent(t.Context(), &undo{})
	if err == nil || !errors.Is(err, exited) || !strings.Contains(err.Error(), "the sandbox vm stopped: "+reason.Error()) {
		t.Fatalf("error %v: want the RAM's reason and the connect error", err)
	}
	st.mem = &stoppedRAM{}
	if err := st.connectAgent(t.Context(), &undo{}); err != exited {
		t.Fatalf("error %v, want the connect error alone", err)
	}
	st.mem = nil
	if err := st.connectAgent(t.Context(), &undo{}); err != exited {
		t.Fatalf("no memory yet: error %v, want the connect error alone", err)
	}
}
