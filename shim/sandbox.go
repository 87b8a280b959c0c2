package shim

import (
	"context"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/sandbox"
	"github.com/cryo-runtime/cryo/vmm"
)

// vmSandbox is what the task service needs of its sandbox, as nerdbox's
// shim holds its VM: *sandbox.Sandbox, or a fake in unit tests.
type vmSandbox interface {
	Guest() sandbox.Guest
	Info() sandbox.Info
	StateDir() string
	RootDisk() vmm.Disk
	AddRootDisk(ctx context.Context, r sandbox.RootSpec) (vmm.Disk, error)
	RemoveRootDisk(ctx context.Context, id string) error
	Adopt(ctx context.Context, rc sandbox.RecordContainer, hostname string) (uint32, error)
	RunHook(ctx context.Context, guestID, cmd, name string) error
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Paused() bool
	Checkpoint(ctx context.Context, r sandbox.CheckpointRequest) (sandbox.CheckpointResult, error)
	// Interacted says the sandbox answered its first exec.
	Interacted()
	// Stop kills the VM within seconds; Shutdown stops it and removes the
	// sandbox's files.
	Stop(ctx context.Context)
	Shutdown(ctx context.Context) error
	Exited() <-chan struct{}
	Stderr() string
	// Failure is why the VM had to stop, when the sandbox knows (a page
	// of a lazy restore that could not be served), nil otherwise.
	Failure() error
	// Request and Annotations are what the sandbox was made for.
	Request() annotations.Request
	Annotations() map[string]string
}

// sandboxMaker boots and restores sandboxes: package sandbox, or a fake.
type sandboxMaker interface {
	Boot(ctx context.Context, spec sandbox.Spec, root sandbox.RootSpec) (vmSandbox, error)
	Restore(ctx context.Context, spec sandbox.Spec, src sandbox.Source) (vmSandbox, *sandbox.Restored, error)
}

// vms makes real sandboxes.
type vms struct{}

func (vms) Boot(ctx context.Context, spec sandbox.Spec, root sandbox.RootSpec) (vmSandbox, error) {
	sb, err := sandbox.Boot(ctx, spec, root)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

func (vms) Restore(ctx context.Context, spec sandbox.Spec, src sandbox.Source) (vmSandbox, *sandbox.Restored, error) {
	sb, rs, err := sandbox.Restore(ctx, spec, src)
	if err != nil {
		return nil, nil, err
	}
	return sb, rs, nil
}
