//go:build integration

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/stack"
)

func hostKernel(t *testing.T) string {
	out, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// TestRunExitCode: `ctr run` prints the workload's output and exits with its
// status, inside the guest kernel, with both snapshotters.
func TestRunExitCode(t *testing.T) {
	e := harness.Start(t)
	for _, sn := range []string{"overlayfs", "blockfile"} {
		t.Run(sn, func(t *testing.T) {
			id := "run-" + sn
			args := e.RunArgs("--rm", "--snapshotter", sn, harness.Image, id, "sh", "-c", "echo hi; uname -r; hostname; exit 3")
			out, errs, err := e.Ctr(args...)
			if code := harness.ExitCode(err); code != 3 {
				t.Fatalf("exit code = %d (%v), want 3\nstdout: %s\nstderr: %s\nlog:\n%s", code, err, out, errs, e.LogTail(40))
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) < 2 || strings.TrimSpace(lines[0]) != "hi" {
				t.Fatalf("stdout = %q, want hi first", out)
			}
			if k := strings.TrimSpace(lines[1]); k == hostKernel(t) || !strings.Contains(k, "cloud-amd64") {
				t.Fatalf("uname -r in the container = %q (host %q): not the guest kernel", k, hostKernel(t))
			}
			if !harness.WaitFor(10*time.Second, func() bool { return len(e.QEMUPids()) == 0 }) {
				t.Fatalf("QEMU still running after ctr run --rm: %v", e.QEMUPids())
			}
		})
	}
}

// TestDetachedLifecycle drives a long-running container through exec, tty,
// ps, metrics, pause/resume, kill and delete.
func TestDetachedLifecycle(t *testing.T) {
	e := harness.Start(t)
	const id = "life"
	e.MustCtr(e.RunArgs("-d", harness.Image, id, "sh", "-c", "echo started > /data/init; trap 'exit 42' TERM; while true; do sleep 0.2; done")...)

	// A file written by one exec is seen by the next: same rootfs.
	e.MustCtr("task", "exec", "--exec-id", "e1", id, "sh", "-c", "echo persisted > /data/f; sync")
	if out := e.MustCtr("task", "exec", "--exec-id", "e2", id, "cat", "/data/f", "/data/init"); out != "persisted\nstarted\n" {
		t.Fatalf("exec cat = %q", out)
	}
	// exit status of an exec
	if _, _, err := e.Ctr("task", "exec", "--exec-id", "e3", id, "sh", "-c", "exit 7"); harness.ExitCode(err) != 7 {
		t.Fatalf("exec exit = %v, want 7", err)
	}
	// tty exec: ctr at a terminal; the guest process gets a pty of its own,
	// of the terminal's size.
	out, err := e.CtrTTY("task", "exec", "-t", "--exec-id", "e4", id, "sh", "-c", "tty; "+stack.TTYSizeScript)
	if err != nil || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, fmt.Sprintf("%d %d", stack.TTYRows, stack.TTYCols)) {
		t.Fatalf("tty exec = %q %v; want a pty of %d rows, %d columns", out, err, stack.TTYRows, stack.TTYCols)
	}
	// ps lists the one host process that runs the container: its VM.
	ps := strings.Split(strings.TrimSpace(e.MustCtr("task", "ps", id)), "\n")
	if q := e.QEMUPids(); len(ps) != 2 || len(q) != 1 || strings.Fields(ps[1])[0] != strconv.Itoa(q[0]) || ctrTaskPid(t, e, id) != q[0] {
		t.Fatalf("task ps = %q, qemu pids %v: want the vm's pid alone, as the task's pid", ps, q)
	}
	metrics := e.MustCtr("task", "metrics", id)
	if !strings.Contains(metrics, "memory") {
		t.Fatalf("task metrics = %q", metrics)
	}
	// pause / resume
	e.MustCtr("task", "pause", id)
	if ls := e.MustCtr("task", "ls"); !strings.Contains(ls, "PAUSED") {
		t.Fatalf("task ls after pause = %q", ls)
	}
	e.MustCtr("task", "resume", id)
	if ls := e.MustCtr("task", "ls"); !strings.Contains(ls, "RUNNING") {
		t.Fatalf("task ls after resume = %q", ls)
	}
	// SIGTERM reaches the workload's trap.
	e.MustCtr("task", "kill", "-s", "SIGTERM", id)
	if !harness.WaitFor(20*time.Second, func() bool { return strings.Contains(e.MustCtr("task", "ls"), "STOPPED") }) {
		t.Fatalf("task did not stop after SIGTERM: %s", e.MustCtr("task", "ls"))
	}
	del := e.MustCtr("task", "delete", id)
	_ = del
	e.MustCtr("c", "rm", id)
	if !harness.WaitFor(10*time.Second, func() bool { return len(e.QEMUPids()) == 0 && len(e.ShimPids()) == 0 }) {
		t.Fatalf("after delete: qemu %v shim %v still running", e.QEMUPids(), e.ShimPids())
	}
}

// TestExitStatusOfTrap checks the exit status that SIGTERM produced.
func TestKillWorkload(t *testing.T) {
	e := harness.Start(t)
	const id = "kill9"
	e.MustCtr(e.RunArgs("-d", harness.Image, id, "sleep", "1000")...)
	e.MustCtr("task", "kill", "-s", "SIGKILL", id)
	waitStopped(t, e, id)
	if out := e.MustCtr("task", "delete", id); !strings.Contains(out, "137") && out != "" {
		t.Logf("task delete: %s", out)
	}
	e.MustCtr("c", "rm", id)
	noLeftovers(t, e)
}

// TestKillQEMU: QEMU killed with SIGKILL: containerd sees the task exit and
// cleanup leaves nothing behind.
func TestKillQEMU(t *testing.T) {
	e := harness.Start(t)
	const id = "killqemu"
	e.MustCtr(e.RunArgs("-d", harness.Image, id, "sleep", "1000")...)
	pids := e.QEMUPids()
	if len(pids) != 1 {
		t.Fatalf("qemu pids = %v, want one", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, e, id)
	e.MustCtr("task", "delete", id)
	e.MustCtr("c", "rm", id)
	noLeftovers(t, e)
}

// TestKillShim: the shim killed with SIGKILL: containerd runs the shim's
// delete action, which kills the VM from the bundle's files alone.
func TestKillShim(t *testing.T) {
	e := harness.Start(t)
	const id = "killshim"
	e.MustCtr(e.RunArgs("-d", harness.Image, id, "sleep", "1000")...)
	shims := e.ShimPids()
	if len(shims) != 1 {
		t.Fatalf("shim pids = %v, want one", shims)
	}
	if err := syscall.Kill(shims[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// containerd notices the dead shim, runs its delete action and removes
	// the task.
	if !harness.WaitFor(30*time.Second, func() bool {
		out, _, err := e.Ctr("task", "ls")
		return err == nil && (!strings.Contains(out, id) || strings.Contains(out, "STOPPED"))
	}) {
		out, _, _ := e.Ctr("task", "ls")
		t.Fatalf("task %s still listed as running after its shim died: %s", id, out)
	}
	_, _, _ = e.Ctr("task", "delete", id)
	e.MustCtr("c", "rm", id)
	noLeftovers(t, e)
}

// TestStartErrors: a missing kernel, a bad config value and a QEMU that fails
// each give one clear error, quickly, with nothing left running.
func TestStartErrors(t *testing.T) {
	e := harness.Start(t)
	for _, tc := range []struct {
		name   string
		mutate func(c *configs.Config)
		raw    string
		want   string
	}{
		{name: "missing kernel", mutate: func(c *configs.Config) { c.Hypervisor.Kernel = "/nonexistent/vmlinuz" }, want: "/nonexistent/vmlinuz"},
		{name: "bad value", raw: "[hypervisor]\naccel = \"xen\"\n", want: "hypervisor.accel"},
		{name: "qemu fails", mutate: func(c *configs.Config) { c.Hypervisor.CPUModel = "no-such-cpu" }, want: "no-such-cpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := e.Dir + "/bad.toml"
			if tc.raw != "" {
				if err := os.WriteFile(path, []byte(tc.raw), 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				c := e.Cfg
				tc.mutate(&c)
				e.WriteConfig(path, c)
			}
			id := "bad" + strconv.Itoa(int(time.Now().UnixNano()%100000))
			start := time.Now()
			out, errs, err := e.Ctr("run", "--rm", "--runtime", harness.Runtime, "--runtime-config-path", path, harness.Image, id, "true")
			if err == nil {
				t.Fatalf("ctr run succeeded with a bad config: %s", out)
			}
			if !strings.Contains(errs, tc.want) {
				t.Fatalf("error does not name %q:\n%s", tc.want, errs)
			}
			if d := time.Since(start); d > 60*time.Second {
				t.Fatalf("error took %s", d)
			}
			_, _, _ = e.Ctr("c", "rm", id)
			noLeftovers(t, e)
		})
	}
}

func waitStopped(t *testing.T, e *harness.Env, id string) {
	t.Helper()
	if !harness.WaitFor(30*time.Second, func() bool {
		out, _, err := e.Ctr("task", "ls")
		return err == nil && strings.Contains(out, id) && strings.Contains(out, "STOPPED")
	}) {
		out, _, _ := e.Ctr("task", "ls")
		t.Fatalf("task %s did not stop: %s\n%s", id, out, e.LogTail(30))
	}
}

func noLeftovers(t *testing.T, e *harness.Env) {
	t.Helper()
	if !harness.WaitFor(15*time.Second, func() bool { return len(e.QEMUPids()) == 0 && len(e.ShimPids()) == 0 }) {
		t.Fatalf("leftover processes: qemu %v shim %v", e.QEMUPids(), e.ShimPids())
	}
	if ents, err := os.ReadDir(e.StateRoot + "/vm"); err == nil && len(ents) > 0 {
		t.Fatalf("leftover sandbox state dirs under %s/vm: %d", e.StateRoot, len(ents))
	}
}
