//go:build integration

package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestHooks: a failing pre-checkpoint hook aborts the checkpoint with the
// hook's output and leaves the previous snapshot at the reference intact;
// the post-restore hook runs in the restored container before it is handed
// over.
func TestHooks(t *testing.T) {
	e := harness.Start(t)
	hook := "cryo.dev/pre-checkpoint-exec=test ! -e /data/refuse || { echo hook-refused; exit 1; }; echo pre > /dev/shm/pre"
	e.MustCtr(e.RunArgs("-d", "--annotation", hook, harness.Image, "src", "sh", "-c", workload)...)
	waitCounting(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("hooks:v1"))

	e.MustCtr("task", "exec", "--exec-id", "refuse", "src", "touch", "/data/refuse")
	out, errs, err := e.Cryoctl("checkpoint", "-n", e.Namespace, "src", "--to", e.StoreURL("hooks:v1"))
	if err == nil || !strings.Contains(errs, "hook-refused") {
		t.Fatalf("checkpoint with a failing hook: err=%v\n%s\n%s", err, out, errs)
	}
	// the sandbox runs on
	waitAdvance(t, e, "src", readState(t, e, "src").counter)

	restore(t, e, "back", e.StoreURL("hooks:v1"), "--annotation", "cryo.dev/post-restore-exec=echo post > /dev/shm/post")
	got := e.MustCtr("task", "exec", "--exec-id", "chk", "back", "sh", "-c", "cat /dev/shm/pre /dev/shm/post; test -e /data/refuse && echo refuse-present || echo first-snapshot")
	if got != "pre\npost\nfirst-snapshot\n" {
		t.Fatalf("restored container: %q, want the pre hook's file, the post hook's file, and the first snapshot's disk", got)
	}
}

func waitCounting(t *testing.T, e *harness.Env, id string) {
	t.Helper()
	if !harness.WaitFor(30*time.Second, func() bool {
		out, _, err := e.Ctr("task", "exec", "--exec-id", "wc", id, "cat", "/dev/shm/counter")
		return err == nil && strings.TrimSpace(out) != "" && strings.TrimSpace(out) != "0"
	}) {
		out, errs, err := e.Ctr("task", "exec", "--exec-id", "wc2", id, "cat", "/dev/shm/counter")
		t.Fatalf("%s is not counting: %q %q %v\n%s", id, out, errs, err, e.LogTail(20))
	}
}

// TestContainerdCheckpoint: containerd's own checkpoint and restore
// (`ctr c checkpoint --task`, `ctr c restore --live`): with no store
// configured the snapshot travels inside containerd's checkpoint image.
func TestContainerdCheckpoint(t *testing.T) {
	e := harness.Start(t)
	before := startWorkload(t, e, "src")
	e.MustCtr("c", "checkpoint", "--task", "src", "cryo.local/checkpoint/src:1")
	// containerd paused the task for the checkpoint and resumed it.
	waitAdvance(t, e, "src", before.counter)
	e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
	waitStopped(t, e, "src")
	e.MustCtr("task", "delete", "src")
	e.MustCtr("c", "rm", "src")

	// ctr c restore --live attaches to the task's output: run it in the
	// background and stop it once the restored task runs.
	done := make(chan error, 1)
	go func() {
		_, errs, err := e.Ctr("c", "restore", "--live", "src", "cryo.local/checkpoint/src:1")
		if err != nil {
			t.Logf("ctr c restore: %v %s", err, errs)
		}
		done <- err
	}()
	if !harness.WaitFor(60*time.Second, func() bool {
		out, _, err := e.Ctr("task", "ls")
		return err == nil && strings.Contains(out, "src") && strings.Contains(out, "RUNNING")
	}) {
		t.Fatalf("restored task not running:\n%s", e.LogTail(40))
	}
	st := readState(t, e, "src")
	if st.bootID != before.bootID || st.secret != before.secret || st.counter < before.counter {
		t.Fatalf("restored through containerd: %+v, checkpointed %+v", st, before)
	}
	e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("ctr c restore did not return after the task was killed")
	}
}
