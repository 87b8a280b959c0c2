package shim

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// sandboxCalls is what the task service asked of the fake sandbox so far.
func (ts *testService) sandboxCalls() []string {
	sb := ts.maker.sb
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return slices.Clone(sb.calls)
}

// startPod creates and starts the pod's init.
func (ts *testService) startPod(t *testing.T) {
	t.Helper()
	ts.create(t, "pod", nil)
	if _, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod"}); err != nil {
		t.Fatal(err)
	}
}

// execIn adds exec id to the pod, its stderr a file (file:// stdio, as
// containerd's binary and file loggers pass it); it returns that file.
func (ts *testService) execIn(t *testing.T, id string) string {
	t.Helper()
	spec, err := typeurl.MarshalAnyToProto(&specs.Process{Args: []string{"true"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	stderr := filepath.Join(ts.dir, id+".stderr")
	if _, err := ts.Exec(ts.ctx, &taskAPI.ExecProcessRequest{ID: "pod", ExecID: id, Spec: spec, Stderr: "file://" + stderr}); err != nil {
		t.Fatal(err)
	}
	return stderr
}

func (ts *testService) waitExec(t *testing.T, id string) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(ts.ctx, 10*time.Second)
	defer cancel()
	w, err := ts.Wait(ctx, &taskAPI.WaitRequest{ID: "pod", ExecID: id})
	if err != nil {
		t.Fatalf("wait for exec %s: %v", id, err)
	}
	return w.ExitStatus
}

// TestVMFailureInStderr: a process whose VM stops under it exits 137, and
// its stderr ends with why the VM stopped when the sandbox knows (a page a
// lazy restore could not serve names its chunk and store), or that it
// stopped.
func TestVMFailureInStderr(t *testing.T) {
	for _, tc := range []struct {
		name    string
		failure error
		want    string
	}{
		{"known", errors.New("served ram at 4096 from s3://store/snap: fetch chunk at offset 0 of ram (sha256:abc): timeout"),
			"cryo: the sandbox vm stopped: served ram at 4096 from s3://store/snap: fetch chunk at offset 0 of ram (sha256:abc): timeout\n"},
		{"unknown", nil, "cryo: the sandbox vm stopped\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestService(t)
			ts.startPod(t)
			stderr := ts.execIn(t, "e1")
			if _, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod", ExecID: "e1"}); err != nil {
				t.Fatal(err)
			}
			ts.maker.sb.mu.Lock()
			ts.maker.sb.failure = tc.failure
			ts.maker.sb.mu.Unlock()
			ts.maker.sb.Stop(ts.ctx)
			if st := ts.waitExec(t, "e1"); st != exitKilled {
				t.Fatalf("exec exit %d, want %d", st, exitKilled)
			}
			b, err := os.ReadFile(stderr)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Fatalf("stderr %q, want %q (once)", b, tc.want)
			}
		})
	}
}

// TestExecStartNamesVMFailure: an exec whose start loses the guest
// connection because the VM died fails with why the VM stopped; one the
// guest refuses fails at once with the guest's error alone.
func TestExecStartNamesVMFailure(t *testing.T) {
	ts := newTestService(t)
	ts.startPod(t)

	ts.execIn(t, "refused")
	ts.maker.sb.guest.startErr = errdefs.ErrNotFound
	start := time.Now()
	_, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod", ExecID: "refused"})
	if err == nil || !errdefs.IsNotFound(err) || strings.Contains(err.Error(), "vm stopped") {
		t.Fatalf("start of a refused exec: %v, want the guest's not found alone", err)
	}
	if d := time.Since(start); d > vmFailureWait/2 {
		t.Fatalf("a refused exec waited %s", d)
	}

	ts.execIn(t, "cut")
	ts.maker.sb.guest.startErr = ttrpc.ErrClosed
	failure := errors.New("served ram at 0 from file:///store: fetch chunk at offset 0 of ram (sha256:abc): digest mismatch")
	go func() {
		time.Sleep(200 * time.Millisecond)
		ts.maker.sb.mu.Lock()
		ts.maker.sb.failure = failure
		ts.maker.sb.mu.Unlock()
		ts.maker.sb.Stop(ts.ctx)
	}()
	_, err = ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod", ExecID: "cut"})
	if err == nil || !errors.Is(err, ttrpc.ErrClosed) || !strings.Contains(err.Error(), "the sandbox vm stopped: "+failure.Error()) {
		t.Fatalf("start of an exec the vm's death cut short: %v, want the reason", err)
	}

	// The VM is gone: a new exec is refused with the reason too.
	spec, _ := typeurl.MarshalAnyToProto(&specs.Process{Args: []string{"true"}, Cwd: "/"})
	c, err := ts.container("pod")
	if err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return c.init.current() == stateStopped }) {
		t.Fatal("the pod's init did not stop with its vm")
	}
	_, err = ts.Exec(ts.ctx, &taskAPI.ExecProcessRequest{ID: "pod", ExecID: "late", Spec: spec})
	if err == nil || !strings.Contains(err.Error(), failure.Error()) {
		t.Fatalf("exec after the vm stopped: %v, want the reason", err)
	}
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestKillExecNotStarted: a signal to an exec that was created but not
// started fails (runc's shim: "process not created"), and the exec can
// still be started and run to its own end; an init that was not started
// ends at a kill, as runc's created container does.
func TestKillExecNotStarted(t *testing.T) {
	ts := newTestService(t)
	ts.startPod(t)
	ts.execIn(t, "e1")
	_, err := ts.Kill(ts.ctx, &taskAPI.KillRequest{ID: "pod", ExecID: "e1", Signal: uint32(unix.SIGTERM)})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("kill of an exec not started: %v, want failed precondition", err)
	}
	if _, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod", ExecID: "e1"}); err != nil {
		t.Fatalf("start after the refused kill: %v", err)
	}
	ts.maker.sb.guest.exit("pod", "e1") <- 3
	if st := ts.waitExec(t, "e1"); st != 3 {
		t.Fatalf("exec exit %d, want its own 3", st)
	}

	ts.create(t, "app", nil)
	if _, err := ts.Kill(ts.ctx, &taskAPI.KillRequest{ID: "app", Signal: uint32(unix.SIGKILL)}); err != nil {
		t.Fatalf("kill of an init not started: %v", err)
	}
	ctx, cancel := context.WithTimeout(ts.ctx, 10*time.Second)
	defer cancel()
	w, err := ts.Wait(ctx, &taskAPI.WaitRequest{ID: "app"})
	if err != nil || w.ExitStatus != 128+uint32(unix.SIGKILL) {
		t.Fatalf("wait of the killed init: %v %v, want exit 137", w, err)
	}
}
