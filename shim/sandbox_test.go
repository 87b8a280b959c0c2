package shim

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/sandbox"
)

// testService is a task service over a fake sandbox, with a node config
// whose directories are the test's.
type testService struct {
	*service
	maker *fakeMaker
	opts  *runtimeoptions.Options
	dir   string
	pub   *slowPublisher
}

func newTestService(t *testing.T) *testService {
	t.Helper()
	dir := t.TempDir()
	// state_root names sockets: it must be short.
	run, err := os.MkdirTemp("/tmp", "cryo-st-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	cfg := filepath.Join(dir, "config.toml")
	toml := "[runtime]\nstate_root = \"" + run + "\"\ndisk_root = \"" + filepath.Join(dir, "disks") + "\"\n"
	if err := os.WriteFile(cfg, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, sd := shutdown.WithShutdown(namespaces.WithNamespace(context.Background(), "test"))
	pub := &slowPublisher{}
	svc, err := NewTaskService(ctx, pub, sd)
	if err != nil {
		t.Fatal(err)
	}
	s := svc.(*service)
	m := &fakeMaker{sb: newFakeSandbox()}
	s.vms = m
	ts := &testService{service: s, maker: m, opts: &runtimeoptions.Options{ConfigPath: cfg}, dir: dir, pub: pub}
	t.Cleanup(func() { ts.end(t) })
	return ts
}

// end kills and deletes the tasks left, then shuts the service down.
func (ts *testService) end(t *testing.T) {
	ts.mu.Lock()
	var ids []string
	for id := range ts.containers {
		ids = append(ids, id)
	}
	ts.mu.Unlock()
	for _, id := range ids {
		_, _ = ts.Kill(ts.ctx, &taskAPI.KillRequest{ID: id, Signal: uint32(unix.SIGKILL)})
		ctx, cancel := context.WithTimeout(ts.ctx, 10*time.Second)
		_, _ = ts.Wait(ctx, &taskAPI.WaitRequest{ID: id})
		cancel()
		_, _ = ts.Delete(ts.ctx, &taskAPI.DeleteRequest{ID: id})
	}
	ts.shutdown.Shutdown()
	<-ts.shutdown.Done()
}

// bundle writes a bundle whose spec has the annotations a.
func (ts *testService) bundle(t *testing.T, id string, a map[string]string) string {
	t.Helper()
	b := filepath.Join(ts.dir, "bundles", id)
	if err := os.MkdirAll(filepath.Join(b, "rootfs"), 0o700); err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(&specs.Spec{
		Version: specs.Version, Process: &specs.Process{Args: []string{"sh"}}, Hostname: id, Annotations: a,
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.UTSNamespace}}},
	})
	if err := os.WriteFile(filepath.Join(b, "config.json"), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

func (ts *testService) create(t *testing.T, id string, a map[string]string) *taskAPI.CreateTaskResponse {
	t.Helper()
	opts, err := typeurl.MarshalAnyToProto(ts.opts)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ts.Create(ts.ctx, &taskAPI.CreateTaskRequest{ID: id, Bundle: ts.bundle(t, id, a), Options: opts})
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	return resp
}

func (ts *testService) status(t *testing.T, id string) (task.Status, uint32) {
	t.Helper()
	st, err := ts.State(ts.ctx, &taskAPI.StateRequest{ID: id})
	if err != nil {
		t.Fatalf("state of %s: %v", id, err)
	}
	return st.Status, st.Pid
}

// TestRestoreAdoptsGuestContainer: a task created with a restore annotation
// restores its sandbox instead of booting one, takes over the guest's
// running container (its init already has a pid, the task is created from
// a checkpoint), and its Start takes that process over instead of starting
// one; its kill and delete end the sandbox.
func TestRestoreAdoptsGuestContainer(t *testing.T) {
	ts := newTestService(t)
	ts.maker.restored = &sandbox.Restored{SandboxID: "old-pod", Containers: []sandbox.RecordContainer{{GuestID: "old-pod", Disk: "root-abc", Spec: &specs.Spec{Hostname: "old"}}}}
	resp := ts.create(t, "pod", map[string]string{annotations.RestoreFrom: "file:///store/agent:v1"})

	if ts.maker.boots != 0 || len(ts.maker.restores) != 1 || ts.maker.restores[0].URL != "file:///store/agent:v1" {
		t.Fatalf("boots %d, restores %+v: want one restore from the annotation", ts.maker.boots, ts.maker.restores)
	}
	if resp.Pid != fakeQEMUPid {
		t.Fatalf("created task pid %d, want the restored VM's %d (not the adopted init's guest pid 42)", resp.Pid, fakeQEMUPid)
	}
	if st, _ := ts.status(t, "pod"); st != task.Status_CREATED {
		t.Fatalf("adopted task is %v, want CREATED", st)
	}
	c, _ := ts.container("pod")
	if c.guestID != "old-pod" || c.init.current() != stateCreatedCheckpoint {
		t.Fatalf("container guest id %q, state %v; want old-pod, created from checkpoint", c.guestID, c.init.current())
	}
	if !slices.Contains(ts.maker.sb.calls, "adopt old-pod pod") {
		t.Fatalf("sandbox calls %v: want the guest container adopted with the new hostname", ts.maker.sb.calls)
	}

	if _, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod"}); err != nil {
		t.Fatal(err)
	}
	if st, pid := ts.status(t, "pod"); st != task.Status_RUNNING || pid != fakeQEMUPid {
		t.Fatalf("started adopted task: %v pid %d, want RUNNING %d", st, pid, fakeQEMUPid)
	}
	if ts.maker.sb.guest.called("start old-pod/") {
		t.Fatal("starting an adopted task started a new process in the guest")
	}

	if _, err := ts.Kill(ts.ctx, &taskAPI.KillRequest{ID: "pod", Signal: uint32(unix.SIGKILL)}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ts.ctx, 10*time.Second)
	defer cancel()
	w, err := ts.Wait(wctx, &taskAPI.WaitRequest{ID: "pod"})
	if err != nil || w.ExitStatus != 137 {
		t.Fatalf("wait: %+v, %v; want exit 137", w, err)
	}
	if _, err := ts.Delete(ts.ctx, &taskAPI.DeleteRequest{ID: "pod"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ts.maker.sb.calls, "shutdown") {
		t.Fatalf("sandbox calls %v: deleting the last task must shut the sandbox down", ts.maker.sb.calls)
	}
}

// TestBootThenSecondContainerHotplugs: without a restore the first task
// boots the sandbox with its root disk; a second task's disk is hot-plugged
// and created in the guest, and removed when the task is deleted.
func TestBootThenSecondContainerHotplugs(t *testing.T) {
	ts := newTestService(t)
	ts.create(t, "pod", nil)
	if ts.maker.boots != 1 || len(ts.maker.restores) != 0 {
		t.Fatalf("boots %d restores %d, want one boot", ts.maker.boots, len(ts.maker.restores))
	}
	ts.create(t, "app", nil)
	g := ts.maker.sb.guest
	if !g.called("create pod") || !g.called("create app") {
		t.Fatalf("guest calls %v: want both containers created", g.calls)
	}
	if !slices.Contains(ts.maker.sb.calls, "add-root app") || slices.Contains(ts.maker.sb.calls, "add-root pod") {
		t.Fatalf("sandbox calls %v: only the second container's disk is hot-plugged", ts.maker.sb.calls)
	}
	if _, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "app"}); err != nil {
		t.Fatal(err)
	}
	if !g.called("start app/") {
		t.Fatalf("guest calls %v: a booted task's Start starts its process", g.calls)
	}
	if _, err := ts.Kill(ts.ctx, &taskAPI.KillRequest{ID: "app", Signal: uint32(unix.SIGKILL)}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ts.ctx, 10*time.Second)
	defer cancel()
	if _, err := ts.Wait(wctx, &taskAPI.WaitRequest{ID: "app"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Delete(ts.ctx, &taskAPI.DeleteRequest{ID: "app"}); err != nil {
		t.Fatal(err)
	}
	if !g.called("remove app") || !slices.Contains(ts.maker.sb.calls, "remove-root "+sandbox.DiskID("app")) || slices.Contains(ts.maker.sb.calls, "shutdown") {
		t.Fatalf("guest %v, sandbox %v: deleting one of two tasks removes it from the guest and unplugs its disk, and keeps the sandbox", g.calls, ts.maker.sb.calls)
	}
}

// TestPausedCheckpoint: containerd pauses a task, checkpoints it and
// resumes it. The checkpoint gets every container with the sandbox's own
// first, the sandbox stays paused through it, and Resume runs it again.
func TestPausedCheckpoint(t *testing.T) {
	ts := newTestService(t)
	ts.create(t, "pod", map[string]string{annotations.CheckpointTo: "file:///store/agent:v1"})
	ts.create(t, "app", nil)
	for _, id := range []string{"pod", "app"} {
		if _, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ts.Pause(ts.ctx, &taskAPI.PauseRequest{ID: "pod"}); err != nil {
		t.Fatal(err)
	}
	if st, _ := ts.status(t, "pod"); st != task.Status_PAUSED || !ts.maker.sb.Paused() {
		t.Fatalf("after Pause: task %v, sandbox paused %v", st, ts.maker.sb.Paused())
	}
	dir := filepath.Join(ts.dir, "ckpt")
	if _, err := ts.Checkpoint(ts.ctx, &taskAPI.CheckpointTaskRequest{ID: "pod", Path: dir}); err != nil {
		t.Fatal(err)
	}
	cps := ts.maker.sb.checkpoints
	if len(cps) != 1 || len(cps[0].Containers) != 2 || cps[0].Containers[0].GuestID != "pod" || cps[0].Trusted {
		t.Fatalf("checkpoint requests %+v: want one, untrusted (a store from the annotation), pod's container first of two", cps)
	}
	if !ts.maker.sb.Paused() {
		t.Fatal("the checkpoint of a paused task resumed its sandbox")
	}
	if src, err := readCheckpointRef(dir); err != nil || src.URL != "file:///store/agent:v1" || src.Digest != "sha256:2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881" {
		t.Fatalf("checkpoint dir reference %+v, %v", src, err)
	}
	if _, err := ts.Resume(ts.ctx, &taskAPI.ResumeRequest{ID: "pod"}); err != nil {
		t.Fatal(err)
	}
	if st, _ := ts.status(t, "pod"); st != task.Status_RUNNING || ts.maker.sb.Paused() {
		t.Fatalf("after Resume: task %v, sandbox paused %v", st, ts.maker.sb.Paused())
	}
	deadline := time.Now().Add(5 * time.Second)
	for !ts.published("/tasks/checkpointed") {
		if time.Now().After(deadline) {
			t.Fatal("no /tasks/checkpointed event")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (ts *testService) published(topic string) bool {
	ts.pub.mu.Lock()
	defer ts.pub.mu.Unlock()
	return slices.Contains(ts.pub.topics, topic)
}

// TestKillBackstopStopsTheVM: a guest that takes SIGKILL but never reports
// the exit loses its VM after killGrace, and the task's exit comes from
// the VM's: no Wait is left hanging on a broken guest.
func TestKillBackstopStopsTheVM(t *testing.T) {
	defer func(g time.Duration) { killGrace = g }(killGrace)
	killGrace = 200 * time.Millisecond
	ts := newTestService(t)
	ts.maker.sb.guest.deaf = true
	ts.create(t, "pod", nil)
	if _, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := ts.Kill(ts.ctx, &taskAPI.KillRequest{ID: "pod", Signal: uint32(unix.SIGKILL)}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ts.ctx, 10*time.Second)
	defer cancel()
	w, err := ts.Wait(wctx, &taskAPI.WaitRequest{ID: "pod"})
	if err != nil || w.ExitStatus != exitKilled {
		t.Fatalf("wait: %+v, %v; want exit %d", w, err, exitKilled)
	}
	if d := time.Since(start); d < killGrace {
		t.Fatalf("exit after %s, before the %s grace", d, killGrace)
	}
	if !slices.Contains(ts.maker.sb.calls, "stop") {
		t.Fatalf("sandbox calls %v: the backstop must stop the vm", ts.maker.sb.calls)
	}
}

// TestRestoredContainersMatchByName: a restored pod's containers take over
// the snapshot's by CRI name; one whose name the snapshot lacks is refused
// with both sets named and leaves no task; the checkpointed containers no
// task claimed within the claim window are killed in the guest.
func TestRestoredContainersMatchByName(t *testing.T) {
	defer func(w time.Duration) { claimWindow = w }(claimWindow)
	claimWindow = 300 * time.Millisecond
	ts := newTestService(t)
	ts.maker.restored = &sandbox.Restored{SandboxID: "old-pod", Containers: []sandbox.RecordContainer{
		{GuestID: "old-pod", Disk: "root-abc", Spec: &specs.Spec{Hostname: "old"}},
		{GuestID: "old-app", Name: "app", Disk: "root-app", Spec: &specs.Spec{Hostname: "old"}},
		{GuestID: "old-side", Name: "side", Disk: "root-side", Spec: &specs.Spec{Hostname: "old"}},
	}}
	ts.create(t, "pod", map[string]string{annotations.RestoreFrom: "file:///store/agent:v1", annotations.CRIContainerType: "sandbox"})

	opts, err := typeurl.MarshalAnyToProto(ts.opts)
	if err != nil {
		t.Fatal(err)
	}
	a := map[string]string{annotations.CRIContainerType: "container", annotations.CRIContainerName: "agent-clone"}
	_, err = ts.Create(ts.ctx, &taskAPI.CreateTaskRequest{ID: "clone", Bundle: ts.bundle(t, "clone", a), Options: opts})
	if err == nil || !strings.Contains(err.Error(), `"agent-clone"`) || !strings.Contains(err.Error(), `["app" "side"]`) {
		t.Fatalf("create a container the snapshot does not hold: %v; want a refusal naming both", err)
	}
	if _, err := ts.container("clone"); err == nil {
		t.Fatal("a refused container was left behind")
	}
	if ts.maker.sb.guest.called("create clone") {
		t.Fatal("a refused container was created in the guest")
	}

	ts.create(t, "app", map[string]string{annotations.CRIContainerType: "container", annotations.CRIContainerName: "app"})
	if c, _ := ts.container("app"); c.guestID != "old-app" {
		t.Fatalf("container app took over guest container %q, want old-app", c.guestID)
	}
	if !harnessWait(5*time.Second, func() bool { return ts.maker.sb.guest.called("remove old-side") }) {
		t.Fatalf("the unclaimed guest container old-side was not removed after the claim window: %v", ts.maker.sb.guest.calls)
	}
	if !ts.maker.sb.guest.called("signal old-side/") {
		t.Fatal("the unclaimed guest container old-side was removed without being killed")
	}
	if ts.maker.sb.guest.called("signal old-app/") || ts.maker.sb.guest.called("remove old-app") {
		t.Fatal("a claimed guest container was reaped")
	}
}

func harnessWait(d time.Duration, ok func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if ok() {
			return true
		}
	}
	return ok()
}

// TestCheckpointRecordsFinishedContainers: a pod's init container, which
// ran and was deleted, is named in the checkpoint as finished (a restored
// pod runs it again); a running container is not.
func TestCheckpointRecordsFinishedContainers(t *testing.T) {
	ts := newTestService(t)
	defer ts.end(t)
	ts.create(t, "pod", map[string]string{annotations.CRIContainerType: "sandbox"})
	ts.create(t, "init", map[string]string{annotations.CRIContainerType: "container", annotations.CRIContainerName: "init"})
	if _, err := ts.Delete(ts.ctx, &taskAPI.DeleteRequest{ID: "init"}); err != nil {
		t.Fatal(err)
	}
	ts.create(t, "app", map[string]string{annotations.CRIContainerType: "container", annotations.CRIContainerName: "app"})
	if _, err := ts.checkpoint(ts.ctx, sandbox.CheckpointRequest{To: "file:///store/x:v1"}); err != nil {
		t.Fatal(err)
	}
	cps := ts.maker.sb.checkpoints
	if len(cps) != 1 || !slices.Equal(cps[0].Finished, []string{"init"}) {
		t.Fatalf("checkpoint requests %+v, want one naming init as finished", cps)
	}
}

// TestRestoreFallbackNotForHook: with restore-fallback cold, a restore that
// fails boots the pod cold instead, but one whose post-restore hook refused
// the restored sandbox does not: a cold boot would run the pod without the
// hook's say.
func TestRestoreFallbackNotForHook(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		boots int
	}{
		{"restore failed", errors.New("restore: fetch+materialize: store down"), 1},
		{"post-restore hook failed", &sandbox.HookError{Err: errors.New(`post-restore hook "false" exited 1`)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestService(t)
			ts.maker.restoreErr = tc.err
			opts, err := typeurl.MarshalAnyToProto(ts.opts)
			if err != nil {
				t.Fatal(err)
			}
			a := map[string]string{annotations.RestoreFrom: "file:///store/agent:v1", annotations.RestoreFallback: "cold"}
			_, err = ts.Create(ts.ctx, &taskAPI.CreateTaskRequest{ID: "pod", Bundle: ts.bundle(t, "pod", a), Options: opts})
			if ts.maker.boots != tc.boots || (tc.boots == 0) != (err != nil) {
				t.Fatalf("create: %v, %d boots; want %d", err, ts.maker.boots, tc.boots)
			}
		})
	}
}
