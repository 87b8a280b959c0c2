package sandbox

import (
	"context"
	"net"
	"os"

	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/vmm"
)

// machine is the VM as a boot's and a restore's steps drive it: a
// *vmm.Machine, or a fake in the step tests, which run every step list
// without QEMU.
type machine interface {
	Start(ctx context.Context) error
	// CheckRestore compares a snapshot's fingerprint with the VM built
	// from it, before Start.
	CheckRestore(saved fingerprint.Fingerprint) error
	LoadState(ctx context.Context, r *os.File) error
	Resume(ctx context.Context) error
	Shutdown(ctx context.Context) error
	Kill()
	Pid() int

	// What connecting to the guest agent needs.
	DialAgent(ctx context.Context) (net.Conn, error)
	Exited() <-chan struct{}
	Stderr() string
	ConsolePath() string
}

var _ machine = (*vmm.Machine)(nil)

// vmFactory makes the machines and agent connections of the steps: QEMU
// and the agent's ttrpc API, or fakes.
type vmFactory struct {
	newMachine func(vmm.Config) (machine, error)
	connect    func(context.Context, machine, AgentTimeouts) (agentConn, guestInfo, error)
}

var qemuFactory = vmFactory{
	newMachine: func(c vmm.Config) (machine, error) {
		m, err := vmm.New(c)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return m, nil
	},
	connect: connectAgent,
}
