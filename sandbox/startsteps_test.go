package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/vmm"
)

// fakeMachine stands for QEMU in the step tests: it records what the
// steps asked of it.
type fakeMachine struct {
	cfg                      vmm.Config
	started, stopped, loaded bool
	exited                   chan struct{}
}

var _ machine = (*fakeMachine)(nil)

func (m *fakeMachine) Start(context.Context) error { m.started = true; return nil }
func (m *fakeMachine) CheckRestore(fingerprint.Fingerprint) error {
	if m.started {
		return errors.New("fingerprint checked after start")
	}
	return nil
}

func (m *fakeMachine) LoadState(_ context.Context, f *os.File) error {
	if !m.started {
		return errors.New("state loaded before start")
	}
	m.loaded = true
	return nil
}

func (m *fakeMachine) Resume(context.Context) error {
	if !m.started || m.stopped {
		return errors.New("resume of a vm that does not run")
	}
	return nil
}

func (m *fakeMachine) Shutdown(context.Context) error {
	if m.started {
		m.stopped = true
	}
	return nil
}
func (m *fakeMachine) Kill()    { m.Shutdown(context.Background()) }
func (m *fakeMachine) Pid() int { return 4242 }
func (m *fakeMachine) DialAgent(context.Context) (net.Conn, error) {
	return nil, errors.New("fake: no agent")
}
func (m *fakeMachine) Exited() <-chan struct{} { return m.exited }
func (m *fakeMachine) Stderr() string          { return "" }
func (m *fakeMachine) ConsolePath() string     { return "" }

// fakeAgent is a connected guest agent; what the steps do not call
// panics (the embedded interface is nil).
type fakeAgent struct {
	agentConn
	closed bool
	// hookStatus is every hook's exit status; hooks the containers they
	// ran in.
	hookStatus int
	hooks      []string
}

func (a *fakeAgent) fixUpRestored(context.Context) error { return nil }
func (a *fakeAgent) close() error                        { a.closed = true; return nil }
func (a *fakeAgent) runHook(_ context.Context, containerID string, _ []string, _ time.Duration) (string, int, error) {
	a.hooks = append(a.hooks, containerID)
	return "", a.hookStatus, nil
}

// fakeVMs makes fake machines and agents and checks that none is left:
// every machine started was stopped, every agent connected closed.
type fakeVMs struct {
	machines []*fakeMachine
	agents   []*fakeAgent
}

func (f *fakeVMs) factory() vmFactory {
	return vmFactory{
		newMachine: func(c vmm.Config) (machine, error) {
			m := &fakeMachine{cfg: c, exited: make(chan struct{})}
			f.machines = append(f.machines, m)
			return m, nil
		},
		connect: func(_ context.Context, m machine, _ AgentTimeouts) (agentConn, guestInfo, error) {
			if fm := m.(*fakeMachine); !fm.started || fm.stopped {
				return nil, guestInfo{}, errors.New("agent of a vm that does not run")
			}
			a := &fakeAgent{}
			f.agents = append(f.agents, a)
			return a, guestInfo{BootID: "boot"}, nil
		},
	}
}

func (f *fakeVMs) leftovers() []string {
	var left []string
	for i, m := range f.machines {
		if m.started && !m.stopped {
			left = append(left, fmt.Sprintf("machine %d runs", i))
		}
	}
	for i, a := range f.agents {
		if !a.closed {
			left = append(left, fmt.Sprintf("agent %d connected", i))
		}
	}
	return left
}

// stepCase is one operation's step list over fakes, made afresh for each
// run; left lists what a failed run left behind.
type stepCase struct {
	op    string
	steps func(t *testing.T, vms vmFactory) []step
	left  func(t *testing.T) []string
	// done ends what the steps made when none failed: the sandbox's
	// holds (the fakes need no stop).
	done func(t *testing.T)
}

// testEachStepFailing runs the step list once whole, then once for each
// step failing, before its work and after it: the error names the
// operation and the step, and nothing is left. The steps are the list
// itself, so a new step is covered without a change here.
func testEachStepFailing(t *testing.T, c stepCase) {
	injected := errors.New("injected")
	run := func(t *testing.T, fail int, after bool) {
		vms := &fakeVMs{}
		steps := c.steps(t, vms.factory())
		var ran []string
		for i := range steps {
			do := steps[i].do
			name := steps[i].name
			steps[i].do = func(ctx context.Context, u *undo) error {
				ran = append(ran, name)
				if i != fail {
					return do(ctx, u)
				}
				if after {
					if err := do(ctx, u); err != nil {
						t.Fatalf("step %s, to fail after its work: %v", name, err)
					}
				}
				return injected
			}
		}
		err := runSteps(t.Context(), c.op, steps)
		if fail < 0 {
			if err != nil {
				t.Fatalf("%s over fakes: %v", c.op, err)
			}
			if len(ran) != len(steps) {
				t.Fatalf("ran %v", ran)
			}
			if c.done != nil {
				c.done(t)
			}
			return
		}
		name := steps[fail].name
		if want := c.op + ": " + name + ": injected"; err == nil || err.Error() != want || !errors.Is(err, injected) {
			t.Errorf("step %s failed: error %v, want %q", name, err, want)
		}
		if len(ran) != fail+1 {
			t.Errorf("step %s failed, yet ran %v", name, ran)
		}
		if left := append(vms.leftovers(), c.left(t)...); len(left) > 0 {
			t.Errorf("step %s failed (after its work: %v), left %v", name, after, left)
		}
	}
	t.Run("none fails", func(t *testing.T) { run(t, -1, false) })
	for i, s := range c.steps(t, (&fakeVMs{}).factory()) {
		t.Run(s.name+" fails", func(t *testing.T) { run(t, i, false) })
		t.Run(s.name+" fails after its work", func(t *testing.T) { run(t, i, true) })
	}
}

// dirEntries lists dir's entries, for an assertion that it holds none.
func dirEntries(t *testing.T, dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, filepath.Join(dir, e.Name()))
	}
	return names
}

// bootStart is a Boot's start over vms on a fresh node (configs.Default
// with its cache in a temporary dir, which also holds an empty root
// image); node changes the config and the spec first.
func bootStart(t *testing.T, vms vmFactory, node func(dir string, cfg *configs.Config, spec *Spec)) (Spec, *start) {
	dir := t.TempDir()
	image := filepath.Join(dir, "root.ext4")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := configs.Default()
	cfg.Snapshot.CacheDir = filepath.Join(dir, "cache")
	// The shim makes the sandbox's dirs before Boot.
	spec := Spec{ID: "sb", StateDir: filepath.Join(dir, "state"), DiskDir: filepath.Join(dir, "disks"), Pod: &specs.Spec{}}
	node(dir, &cfg, &spec)
	spec.Node = testNode(t, cfg)
	root := RootSpec{ContainerID: "c1", Mounts: []*types.Mount{{Type: "ext4", Source: image}}}
	return spec, &start{Spec: spec, root: root, vms: vms}
}

// TestBootSteps: Boot's steps over a fake machine and agent, each failing
// in turn.
func TestBootSteps(t *testing.T) {
	var spec Spec
	var st *start
	testEachStepFailing(t, stepCase{
		op: "boot",
		steps: func(t *testing.T, vms vmFactory) []step {
			spec, st = bootStart(t, vms, func(string, *configs.Config, *Spec) {})
			return st.bootSteps(&Sandbox{spec: spec, rootfs: newRootfsBuilder(spec.Node.RootFS)})
		},
		done: func(t *testing.T) {
			checkMemory(t, st, vmm.MemoryOwned, ramPath(spec.Node.VM.MemoryDir, spec.StateDir))
		},
		left: func(t *testing.T) []string {
			return append(dirEntries(t, spec.StateDir), dirEntries(t, spec.DiskDir)...)
		},
	})
}

// TestBootStepsServedRAM: Boot's steps on a node that serves booted RAM
// ([memory] booted = "served"): the VM boots on a pagefs file served from
// zeros (shared, not incoming, QEMU's uid admitted), and a step that fails
// leaves no mount nor layer.
func TestBootStepsServedRAM(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("pagefs mounts need root: run go test as root")
	}
	var spec Spec
	var st *start
	testEachStepFailing(t, stepCase{
		op: "boot",
		steps: func(t *testing.T, vms vmFactory) []step {
			spec, st = bootStart(t, vms, func(dir string, cfg *configs.Config, spec *Spec) {
				cfg.Hypervisor.MemoryDir = filepath.Join(dir, "shm")
				cfg.Memory.Booted = configs.BootedServed
				if err := os.Mkdir(cfg.Hypervisor.MemoryDir, 0o700); err != nil {
					t.Fatal(err)
				}
				spec.MemoryMiB = 64
			})
			return st.bootSteps(&Sandbox{spec: spec, rootfs: newRootfsBuilder(spec.Node.RootFS)})
		},
		done: func(t *testing.T) {
			checkMemory(t, st, vmm.MemoryServed, filepath.Join(spec.StateDir, "pagefs", "ram"))
			if st.vmcfg.AdmitUID == nil {
				t.Error("served ram admits no uid: a confined QEMU could not open it")
			}
			if err := st.mem.close(t.Context(), nil); err != nil {
				t.Fatal(err)
			}
		},
		left: func(t *testing.T) []string {
			return slices.Concat(dirEntries(t, spec.StateDir), dirEntries(t, spec.DiskDir), dirEntries(t, spec.Node.VM.MemoryDir))
		},
	})
}

// restoreFixture is a node that can restore one snapshot except for
// QEMU: a file:// store holding it, host files and a QEMU that only
// tells its version, matching the snapshot's fingerprint.
type restoreFixture struct {
	cfg configs.Config
	url string
}

func newRestoreFixture(t *testing.T) *restoreFixture {
	dir := t.TempDir()
	cfg := configs.Default()
	cfg.Snapshot.CacheDir = filepath.Join(dir, "cache")
	cfg.Stores.Allowed = []string{"file://" + dir + "/store/"}
	h := &cfg.Hypervisor
	h.Path = filepath.Join(dir, "qemu")
	h.Kernel, h.Initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img")
	h.MachineType, h.CPUModel, h.Accel = "pc-q35-7.2", "qemu64", "tcg"
	h.MemoryDir = filepath.Join(dir, "mem") // a lazy restore's RAM layer
	write := func(path, content string, mode os.FileMode) {
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(h.MemoryDir, 0o700); err != nil {
		t.Fatal(err)
	}
	write(h.Path, "#!/bin/sh\necho 'QEMU emulator version 7.2.0'\n", 0o755)
	write(h.Kernel, "kernel", 0o644)
	write(h.Initrd, "initrd", 0o644)
	digestOf := func(s string) string { sum := sha256.Sum256([]byte(s)); return "sha256:" + hex.EncodeToString(sum[:]) }

	rec := &sandboxRecord{
		Version: recordVersion, SandboxID: "s", VCPUs: 1, MemoryMiB: 128, HotplugPort: 2,
		Disks:      []recordDisk{{Name: "root-0a1b2c3d4e5f", ID: "root-0a1b2c3d4e5f", Serial: "cryo0a1b2c3d4e5f6a7b"}},
		Containers: []RecordContainer{{GuestID: "s", Name: "app", Disk: "root-0a1b2c3d4e5f", Spec: &specs.Spec{Hostname: "web-0"}}},
	}
	spec, _ := json.Marshal(rec)
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o700); err != nil {
		t.Fatal(err)
	}
	paths := snapshot.SourcePaths{RAM: filepath.Join(src, "ram"), DevState: filepath.Join(src, "devstate"), Spec: spec,
		Disks: map[string]string{rec.Disks[0].Name: filepath.Join(src, "root.raw")}}
	write(paths.RAM, "guest ram", 0o600)
	write(paths.DevState, "device state", 0o600)
	write(paths.Disks[rec.Disks[0].Name], "root disk", 0o600)
	if err := os.Truncate(paths.Disks[rec.Disks[0].Name], 1<<20); err != nil {
		t.Fatal(err)
	}
	md := snapshot.Metadata{Fingerprint: fingerprint.Fingerprint{
		QEMUVersion: "7.2.0", MachineType: h.MachineType, CPUModel: h.CPUModel, Accel: h.Accel,
		MemoryMiB: 128, VCPUs: 1, KernelDigest: digestOf("kernel"), InitrdDigest: digestOf("initrd"),
	}}
	f := &restoreFixture{cfg: cfg, url: "file://" + dir + "/store/agent:v1"}
	source, err := snapshot.NewSource(md, paths)
	if err != nil {
		t.Fatal(err)
	}
	defer source.Close()
	store, ref, err := stores.Open(t.Context(), f.url, stores.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := snapshot.Write(t.Context(), store, ref, source, snapshot.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return f
}

// spec is a sandbox restored on the fixture's node, in a new temporary
// dir; made: with its dirs made, as the shim makes them before a restore.
func (f *restoreFixture) spec(t *testing.T, made bool) Spec {
	dir := t.TempDir()
	spec := Spec{ID: "sb", Node: testNode(t, f.cfg), StateDir: filepath.Join(dir, "state"), DiskDir: filepath.Join(dir, "disks"), Pod: &specs.Spec{},
		Tenant: "default"}
	spec.RestoreMode = RestoreEager
	for _, d := range []string{spec.StateDir, spec.DiskDir} {
		if !made {
			break
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return spec
}

// inUse lists the node's materialized snapshots that a sandbox still
// holds.
func (f *restoreFixture) inUse(t *testing.T) []string {
	node, err := f.cfg.Snapshot.NodeCache()
	if err != nil {
		t.Fatal(err)
	}
	st, err := node.Snapshots().Prune(t.Context(), 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if st.InUse > 0 {
		return []string{fmt.Sprintf("%d materialized snapshots in use", st.InUse)}
	}
	return nil
}

// TestRestoreSteps: an eager restore's steps, from a real snapshot in a
// file:// store through the node cache, over a fake machine and agent,
// each failing in turn: no file in the sandbox's dirs, no use of the
// materialized snapshot, no running machine or open agent is left.
func TestRestoreSteps(t *testing.T) {
	f := newRestoreFixture(t)
	var spec Spec
	var st *start
	testEachStepFailing(t, stepCase{
		op: "restore",
		steps: func(t *testing.T, vms vmFactory) []step {
			spec = f.spec(t, true)
			st = &start{Spec: spec, src: Source{URL: f.url}, restore: &restoring{}, vms: vms}
			return st.restoreSteps()
		},
		done: func(t *testing.T) {
			checkMemory(t, st, vmm.MemoryPrivate, st.restore.mat.RAM)
			st.restore.release()
		},
		left: func(t *testing.T) []string {
			return slices.Concat(dirEntries(t, spec.StateDir), dirEntries(t, spec.DiskDir), f.inUse(t))
		},
	})
}

// TestLazyRestoreSteps: a lazy restore's steps, its RAM and disk served
// from the snapshot through a pagefs mount, each failing in turn: also
// no mount, no RAM layer and no served record is left.
func TestLazyRestoreSteps(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("mounting pagefs needs root: run go test as root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Fatal("no /dev/fuse: load the fuse module (modprobe fuse)")
	}
	f := newRestoreFixture(t)
	var spec Spec
	var st *start
	testEachStepFailing(t, stepCase{
		op: "restore",
		steps: func(t *testing.T, vms vmFactory) []step {
			spec = f.spec(t, true)
			spec.RestoreMode = RestoreLazy
			st = &start{Spec: spec, src: Source{URL: f.url}, restore: &restoring{}, vms: vms}
			return st.restoreSteps()
		},
		done: func(t *testing.T) {
			// What the leftover check looks for is there while served.
			if _, ok := st.mem.(*servedMemory); !ok || len(mountsUnder(t, spec.StateDir)) == 0 {
				t.Fatalf("a lazy restore served nothing (its memory: %T)", st.mem)
			}
			checkMemory(t, st, vmm.MemoryServed, st.restore.mat.RAM)
			if st.vmcfg.AdmitUID == nil {
				t.Error("served ram admits no uid: a confined QEMU could not open it")
			}
			if err := st.mem.close(t.Context(), nil); err != nil {
				t.Fatal(err)
			}
			st.restore.release()
		},
		left: func(t *testing.T) []string {
			return slices.Concat(dirEntries(t, spec.StateDir), dirEntries(t, spec.DiskDir),
				dirEntries(t, f.cfg.Hypervisor.MemoryDir), mountsUnder(t, spec.StateDir), f.inUse(t))
		},
	})
}

// mountsUnder lists the mount points under dir.
func mountsUnder(t *testing.T, dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, "mount "+fields[4])
		}
	}
	return mounts
}

// TestFloorSteps: the floor's steps (Restore's, from the node cache)
// each failing in turn; whether they fail or not, the sandbox's dirs go.
func TestFloorSteps(t *testing.T) {
	f := newRestoreFixture(t)
	var spec Spec
	// The floor needs the snapshot in the node cache: a restore first.
	warm := &start{Spec: f.spec(t, true), src: Source{URL: f.url}, restore: &restoring{}, vms: (&fakeVMs{}).factory()}
	if err := runSteps(t.Context(), "restore", warm.fetchSteps()); err != nil {
		t.Fatal(err)
	}
	warm.restore.release()
	testEachStepFailing(t, stepCase{
		op: "floor",
		steps: func(t *testing.T, vms vmFactory) []step {
			spec = f.spec(t, false)
			st := &start{Spec: spec, src: Source{URL: f.url}, restore: &restoring{}, vms: vms}
			var took time.Duration
			return st.floorSteps(&took)
		},
		left: func(t *testing.T) []string {
			var left []string
			for _, d := range []string{spec.StateDir, spec.DiskDir} {
				if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
					left = append(left, d)
				}
			}
			return append(left, f.inUse(t)...)
		},
	})
}

// checkMemory: the steps made the guest memory of mode, which configured
// the VM to map path.
func checkMemory(t *testing.T, st *start, mode vmm.MemoryMode, path string) {
	t.Helper()
	// Every restore's QEMU waits for the incoming state; a boot's does not.
	incoming := st.restore != nil
	if got := st.vmcfg.Memory; got.Mode != mode || got.Path != path || path == "" || got.Incoming != incoming {
		t.Errorf("vm memory %v %q incoming %v, want %v %q incoming %v", got.Mode, got.Path, got.Incoming, mode, path, incoming)
	}
}

// TestPostRestoreHook: the post-restore hook runs in the checkpointed
// sandbox's own container; its failure is a HookError (the shim does not
// fall back to a cold boot for it), still a failed precondition.
func TestPostRestoreHook(t *testing.T) {
	for _, status := range []int{0, 1} {
		ag := &fakeAgent{hookStatus: status}
		st := &start{Spec: Spec{PostRestore: "test -e /ready"}, agent: ag, restore: &restoring{rec: &sandboxRecord{SandboxID: "old-pod"}}}
		err := st.postRestore(t.Context(), &undo{})
		if !slices.Equal(ag.hooks, []string{"old-pod"}) {
			t.Fatalf("hook ran in %v, want the sandbox's own container old-pod", ag.hooks)
		}
		var he *HookError
		if (status != 0) != (err != nil) || err != nil && (!errors.As(err, &he) || !errdefs.IsFailedPrecondition(err)) {
			t.Fatalf("hook exiting %d: %v, want a HookError that is a failed precondition only on failure", status, err)
		}
	}
	ag := &fakeAgent{}
	st := &start{agent: ag, restore: &restoring{rec: &sandboxRecord{SandboxID: "old-pod"}}}
	if err := st.postRestore(t.Context(), &undo{}); err != nil || len(ag.hooks) != 0 {
		t.Fatalf("no hook: %v, ran %v", err, ag.hooks)
	}
}
