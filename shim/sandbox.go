package shim

import (
	"context"

	"github.com/cryo-runtime/cryo/sandbox"
)

// vmSandbox is what the task service needs of its sandbox, as nerdbox's
// shim holds its VM: *sandbox.Sandbox, or a fake in unit tests.
type vmSandbox interface {
	Guest() sandbox.Guest
	// Info describes the running sandbox, its boot's root disk included.
	Info() sandbox.Info
	AddRootDisk(ctx context.Context, r sandbox.RootSpec) (sandbox.Disk, error)
	RemoveRootDisk(ctx context.Context, id string) error
	Adopt(ctx context.Context, rc sandbox.RecordContainer, hostname string) (uint32, error)
	// Pause and Resume stop and continue the VM's vCPUs; the task
	// service keeps whether it paused it.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Checkpoint(ctx context.Context, r sandbox.CheckpointRequest) (sandbox.CheckpointResult, error)
	// Stop kills the VM within seconds; Shutdown stops it and removes the
	// sandbox's files.
	Stop(ctx context.Context)
	Shutdown(ctx context.Context) error
	// Done is closed when the VM has exited; Err is then why it had to
	// stop, when the sandbox knows (a page of a lazy restore that could
	// not be served), nil otherwise.
	Done() <-chan struct{}
	Err() error
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
