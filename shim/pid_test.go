package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// eventPids returns the pid of every task event published so far, by
// topic and id ("/tasks/exit pod/e1").
func (ts *testService) eventPids() map[string]uint32 {
	ts.pub.mu.Lock()
	defer ts.pub.mu.Unlock()
	pids := map[string]uint32{}
	for _, e := range ts.pub.events {
		switch e := e.(type) {
		case *eventstypes.TaskCreate:
			pids["/tasks/create "+e.ContainerID] = e.Pid
		case *eventstypes.TaskStart:
			pids["/tasks/start "+e.ContainerID] = e.Pid
		case *eventstypes.TaskExecStarted:
			pids["/tasks/exec-started "+e.ContainerID+"/"+e.ExecID] = e.Pid
		case *eventstypes.TaskExit:
			pids["/tasks/exit "+e.ContainerID+"/"+e.ID] = e.Pid
		case *eventstypes.TaskDelete:
			pids["/tasks/delete "+e.ContainerID] = e.Pid
		}
	}
	return pids
}

// TestTaskPidsAreTheVMs: every pid the shim gives containerd for a task or
// an exec (responses and events) is the VM's host pid, never the guest's
// (7): a kill or cgroup lookup by pid must reach the sandbox. An exec that
// has not started has none. Pids lists the VM alone.
func TestTaskPidsAreTheVMs(t *testing.T) {
	ts := newTestService(t)
	want := uint32(fakeQEMUPid)
	check := func(what string, got uint32) {
		t.Helper()
		if got != want {
			t.Errorf("%s: pid %d, want the vm's %d", what, got, want)
		}
	}
	check("create", ts.create(t, "pod", nil).Pid)
	st, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod"})
	if err != nil {
		t.Fatal(err)
	}
	check("start", st.Pid)
	_, pid := ts.status(t, "pod")
	check("state", pid)
	conn, err := ts.Connect(ts.ctx, &taskAPI.ConnectRequest{ID: "pod"})
	if err != nil {
		t.Fatal(err)
	}
	check("connect", conn.TaskPid)

	ts.execIn(t, "e1")
	es, err := ts.State(ts.ctx, &taskAPI.StateRequest{ID: "pod", ExecID: "e1"})
	if err != nil || es.Pid != 0 {
		t.Fatalf("state of an exec not started: pid %d, %v; want 0", es.GetPid(), err)
	}
	est, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod", ExecID: "e1"})
	if err != nil {
		t.Fatal(err)
	}
	check("exec start", est.Pid)
	ps, err := ts.Pids(ts.ctx, &taskAPI.PidsRequest{ID: "pod"})
	if err != nil || len(ps.Processes) != 1 {
		t.Fatalf("pids: %v, %v; want the vm alone", ps, err)
	}
	check("pids", ps.Processes[0].Pid)
	ts.maker.sb.guest.exit("pod", "e1") <- 0
	ts.waitExec(t, "e1")
	ed, err := ts.Delete(ts.ctx, &taskAPI.DeleteRequest{ID: "pod", ExecID: "e1"})
	if err != nil {
		t.Fatal(err)
	}
	check("exec delete", ed.Pid)

	if _, err := ts.Kill(ts.ctx, &taskAPI.KillRequest{ID: "pod", Signal: uint32(unix.SIGKILL)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ts.ctx, 10*time.Second)
	defer cancel()
	if _, err := ts.Wait(ctx, &taskAPI.WaitRequest{ID: "pod"}); err != nil {
		t.Fatal(err)
	}
	d, err := ts.Delete(ts.ctx, &taskAPI.DeleteRequest{ID: "pod"})
	if err != nil {
		t.Fatal(err)
	}
	check("delete", d.Pid)

	events := []string{"/tasks/create pod", "/tasks/start pod", "/tasks/exec-started pod/e1", "/tasks/exit pod/e1", "/tasks/exit pod/pod", "/tasks/delete pod"}
	var pids map[string]uint32
	waitFor(5*time.Second, func() bool { pids = ts.eventPids(); return len(pids) == len(events) })
	for _, e := range events {
		p, ok := pids[e]
		if !ok {
			t.Errorf("event %s not published (published: %v)", e, pids)
			continue
		}
		check(e, p)
	}
}

// TestShimDeleteReportsTaskPid: the bundle records the task's pid from
// Create on, so `shim delete` after a crash of the shim reports the pid
// containerd knew, for a container that runs (no exit record yet) or has
// exited (its exit record), and for the sandbox's own, which also takes
// the VM down.
func TestShimDeleteReportsTaskPid(t *testing.T) {
	ts := newTestService(t)
	ts.startPod(t)
	ts.create(t, "app", nil)
	if _, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "app"}); err != nil {
		t.Fatal(err)
	}
	stop := func(id string) (pid, status int) {
		t.Helper()
		c, err := ts.container(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Chdir(c.bundle) // the delete action runs in the bundle
		var m manager
		st, err := m.Stop(ts.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return st.Pid, st.ExitStatus
	}
	if pid, st := stop("app"); pid != fakeQEMUPid || st != int(exitKilled) {
		t.Fatalf("shim delete of a running container: pid %d status %d, want %d %d", pid, st, fakeQEMUPid, exitKilled)
	}
	ts.maker.sb.guest.exit("app", "") <- 3
	ctx, cancel := context.WithTimeout(ts.ctx, 10*time.Second)
	defer cancel()
	if _, err := ts.Wait(ctx, &taskAPI.WaitRequest{ID: "app"}); err != nil {
		t.Fatal(err)
	}
	if pid, st := stop("app"); pid != fakeQEMUPid || st != 3 {
		t.Fatalf("shim delete of an exited container: pid %d status %d, want %d 3", pid, st, fakeQEMUPid)
	}
	if pid, st := stop("pod"); pid != fakeQEMUPid || st != int(exitKilled) {
		t.Fatalf("shim delete of the sandbox's container: pid %d status %d, want %d %d", pid, st, fakeQEMUPid, exitKilled)
	}
}

// TestPidRecordIsValidated: a pid record that is not a number is an error,
// not pid 0 taken silently.
func TestPidRecordIsValidated(t *testing.T) {
	dir := t.TempDir()
	if err := writePidRecord(dir, 4242); err != nil {
		t.Fatal(err)
	}
	if pid, err := readPidRecord(dir); err != nil || pid != 4242 {
		t.Fatalf("read pid record: %d, %v", pid, err)
	}
	for _, bad := range []string{"", "-1", "x", fmt.Sprint(uint64(1) << 33)} {
		if err := os.WriteFile(filepath.Join(dir, pidRecordFile), []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if pid, err := readPidRecord(dir); err == nil {
			t.Fatalf("pid record %q read as %d", bad, pid)
		}
	}
}

// TestHostNetworkHostnameRefused: a task whose spec sets a hostname
// without a UTS namespace fails Create before any VM boots.
func TestHostNetworkHostnameRefused(t *testing.T) {
	ts := newTestService(t)
	b := ts.bundle(t, "pod", nil)
	spec, _ := json.Marshal(&specs.Spec{
		Version: specs.Version, Process: &specs.Process{Args: []string{"sh"}}, Hostname: "custom",
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}}},
	})
	if err := os.WriteFile(filepath.Join(b, "config.json"), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := typeurl.MarshalAnyToProto(ts.opts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ts.Create(ts.ctx, &taskAPI.CreateTaskRequest{ID: "pod", Bundle: b, Options: opts})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("create: %v, want an invalid argument", err)
	}
	if ts.maker.boots != 0 {
		t.Fatalf("%d vm boots for a refused spec", ts.maker.boots)
	}
}
