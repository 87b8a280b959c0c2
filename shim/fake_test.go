package shim

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cryo-runtime/cryo/sandbox"
)

// fakeQEMUPid is the fake VM's pid; the fake guest's processes have pid 7,
// an adopted one 42.
const fakeQEMUPid = 4242

// fakeMaker makes fake sandboxes: a restore when the spec names a source.
type fakeMaker struct {
	sb       *fakeSandbox
	restored *sandbox.Restored
	// restoreErr fails every Restore.
	restoreErr error
	boots      int
	restores   []sandbox.Source
}

func (m *fakeMaker) Boot(ctx context.Context, spec sandbox.Spec, root sandbox.RootSpec) (vmSandbox, error) {
	m.boots++
	m.sb.spec = spec
	m.sb.root = sandbox.Disk{ID: sandbox.DiskID(root.ContainerID), Serial: "s1"}
	return m.sb, nil
}

func (m *fakeMaker) Restore(ctx context.Context, spec sandbox.Spec, src sandbox.Source) (vmSandbox, *sandbox.Restored, error) {
	m.restores = append(m.restores, src)
	if m.restoreErr != nil {
		return nil, nil, m.restoreErr
	}
	m.sb.spec = spec
	return m.sb, m.restored, nil
}

// fakeSandbox records what the task service asks of its sandbox.
type fakeSandbox struct {
	mu          sync.Mutex
	spec        sandbox.Spec
	root        sandbox.Disk
	guest       *fakeGuest
	paused      bool
	calls       []string
	checkpoints []sandbox.CheckpointRequest
	adoptPid    uint32
	// qemuPid is the VM's host pid, what tasks report.
	qemuPid  int
	exited   chan struct{}
	stopOnce sync.Once
	// failure is what Err reports once the VM has stopped.
	failure error
}

func newFakeSandbox() *fakeSandbox {
	exited := make(chan struct{})
	g := newFakeGuest()
	g.vmGone = exited
	return &fakeSandbox{guest: g, exited: exited, adoptPid: 42, qemuPid: fakeQEMUPid}
}

func (f *fakeSandbox) call(c string) {
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
}

func (f *fakeSandbox) Guest() sandbox.Guest { return f.guest }
func (f *fakeSandbox) Info() sandbox.Info {
	return sandbox.Info{ID: f.spec.ID, QEMUPid: f.qemuPid, RootDisk: f.root}
}
func (f *fakeSandbox) AddRootDisk(ctx context.Context, r sandbox.RootSpec) (sandbox.Disk, error) {
	f.call("add-root " + r.ContainerID)
	return sandbox.Disk{ID: sandbox.DiskID(r.ContainerID)}, nil
}
func (f *fakeSandbox) RemoveRootDisk(ctx context.Context, id string) error {
	f.call("remove-root " + id)
	return nil
}
func (f *fakeSandbox) Adopt(ctx context.Context, rc sandbox.RecordContainer, hostname string) (uint32, error) {
	f.call("adopt " + rc.GuestID + " " + hostname)
	return f.adoptPid, nil
}
func (f *fakeSandbox) Pause(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paused = true
	f.calls = append(f.calls, "pause")
	return nil
}
func (f *fakeSandbox) Resume(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paused = false
	f.calls = append(f.calls, "resume")
	return nil
}
func (f *fakeSandbox) Paused() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.paused
}
func (f *fakeSandbox) Checkpoint(ctx context.Context, r sandbox.CheckpointRequest) (sandbox.CheckpointResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkpoints = append(f.checkpoints, r)
	to := r.To
	if to == "" {
		to = f.spec.CheckpointTo
	}
	return sandbox.CheckpointResult{Ref: to, Digest: "sha256:2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"}, nil
}
func (f *fakeSandbox) Stop(ctx context.Context) {
	f.call("stop")
	f.stopOnce.Do(func() { close(f.exited) })
}
func (f *fakeSandbox) Shutdown(ctx context.Context) error {
	f.call("shutdown")
	f.stopOnce.Do(func() { close(f.exited) })
	return nil
}
func (f *fakeSandbox) Done() <-chan struct{} { return f.exited }
func (f *fakeSandbox) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failure
}

// fakeGuest is a guest agent whose processes run until signalled.
type fakeGuest struct {
	// deaf guests take a signal and never report the exit.
	deaf    bool
	mu      sync.Mutex
	calls   []string
	exits   map[string]chan uint32 // by container/exec
	started map[string]bool
	// vmGone ends every Wait with a lost connection, as the real agent
	// connection ends when its VM stops.
	vmGone <-chan struct{}
	// startErr fails StartProcess.
	startErr error
	// stdout, by container/exec, is what ReadStdio returns of a process's
	// stdout until the channel closes (the last writer of the guest's pipe
	// closed); a process without one has no output.
	stdout map[string]chan []byte
	// oomKills, when set, are the counts WaitOOM returns, in order.
	oomKills chan uint64
}

func newFakeGuest() *fakeGuest {
	return &fakeGuest{exits: map[string]chan uint32{}, started: map[string]bool{}, stdout: map[string]chan []byte{}}
}

func (g *fakeGuest) exit(containerID, execID string) chan uint32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := containerID + "/" + execID
	if g.exits[k] == nil {
		g.exits[k] = make(chan uint32, 1)
	}
	return g.exits[k]
}

func (g *fakeGuest) call(c string) {
	g.mu.Lock()
	g.calls = append(g.calls, c)
	g.mu.Unlock()
}

func (g *fakeGuest) called(c string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, x := range g.calls {
		if x == c {
			return true
		}
	}
	return false
}

func (g *fakeGuest) CreateContainer(ctx context.Context, r sandbox.CreateRequest) error {
	g.call("create " + r.ID)
	return nil
}
func (g *fakeGuest) StartProcess(ctx context.Context, containerID, execID string) (uint32, error) {
	g.call("start " + containerID + "/" + execID)
	if g.startErr != nil {
		return 0, g.startErr
	}
	return 7, nil
}
func (g *fakeGuest) ExecProcess(ctx context.Context, containerID, execID string, p *specs.Process, s sandbox.Stdio) error {
	g.call("exec " + containerID + "/" + execID)
	return nil
}
func (g *fakeGuest) Signal(ctx context.Context, containerID, execID string, sig uint32, all bool) error {
	g.call("signal " + containerID + "/" + execID)
	if g.deaf {
		return nil
	}
	select {
	case g.exit(containerID, execID) <- 128 + sig:
	default:
	}
	return nil
}
func (g *fakeGuest) Wait(ctx context.Context, containerID, execID string) (uint32, time.Time, error) {
	select {
	case st := <-g.exit(containerID, execID):
		return st, time.Now(), nil
	case <-g.vmGone:
		return 0, time.Time{}, ttrpc.ErrClosed
	case <-ctx.Done():
		return 0, time.Time{}, ctx.Err()
	}
}

// output returns the stdout channel of a process, made on first use.
func (g *fakeGuest) output(containerID, execID string) chan []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := containerID + "/" + execID
	if g.stdout[k] == nil {
		g.stdout[k] = make(chan []byte, 16)
	}
	return g.stdout[k]
}

func (g *fakeGuest) ReadStdio(ctx context.Context, containerID, execID string, stderr bool) ([]byte, error) {
	g.mu.Lock()
	out := g.stdout[containerID+"/"+execID]
	g.mu.Unlock()
	if stderr || out == nil {
		return nil, io.EOF
	}
	select {
	case b, ok := <-out:
		if !ok {
			return nil, io.EOF
		}
		return b, nil
	case <-g.vmGone:
		return nil, ttrpc.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (g *fakeGuest) WriteStdin(ctx context.Context, containerID, execID string, data []byte) error {
	return nil
}
func (g *fakeGuest) CloseStdin(ctx context.Context, containerID, execID string) error { return nil }
func (g *fakeGuest) Resize(ctx context.Context, containerID, execID string, w, h uint32) error {
	return nil
}
func (g *fakeGuest) Pids(ctx context.Context, containerID string) ([]uint32, error) {
	return []uint32{1}, nil
}
func (g *fakeGuest) Stats(ctx context.Context, containerID string) (*anypb.Any, error) {
	return nil, nil
}
func (g *fakeGuest) RemoveContainer(ctx context.Context, containerID string) error {
	g.call("remove " + containerID)
	return nil
}
func (g *fakeGuest) DeleteProcess(ctx context.Context, containerID, execID string) error {
	return nil
}
func (g *fakeGuest) WaitOOM(ctx context.Context, containerID string, seen uint64) (uint64, error) {
	select {
	case n := <-g.oomKills: // nil: none ever
		return n, nil
	case <-g.vmGone:
		return 0, ttrpc.ErrClosed
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}
