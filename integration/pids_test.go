//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// inspectPid is the pid CRI reports for a pod (inspectp) or a container
// (inspect): the one its task was given.
func inspectPid(t *testing.T, c *harness.CRI, verb, id string) int {
	t.Helper()
	var v struct {
		Info struct {
			Pid int `json:"pid"`
		} `json:"info"`
	}
	out := c.MustCrictl(verb, "-o", "json", id)
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("crictl %s %s: %v\n%s", verb, id, err, out)
	}
	return v.Info.Pid
}

// mustBeQEMU fails the test unless pid is the one QEMU of the Env.
func mustBeQEMU(t *testing.T, c *harness.CRI, what string, pid int) {
	t.Helper()
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "qemu-system") {
		t.Fatalf("%s: pid %d is not a QEMU (cmdline %q, %v); qemu pids %v", what, pid, strings.ReplaceAll(string(cmdline), "\x00", " "), err, c.QEMUPids())
	}
	if q := c.QEMUPids(); len(q) != 1 || q[0] != pid {
		t.Fatalf("%s: pid %d, the sandbox's QEMU is %v", what, pid, q)
	}
}

// ctrTaskPid is the pid `ctr task ls` shows for task id.
func ctrTaskPid(t *testing.T, e *harness.Env, id string) int {
	t.Helper()
	for _, l := range strings.Split(e.MustCtr("task", "ls"), "\n")[1:] {
		if f := strings.Fields(l); len(f) == 3 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("ctr task ls: %q", l)
			}
			return pid
		}
	}
	t.Fatalf("ctr task ls does not list %s", id)
	return 0
}

// TestCRIHostPids: a pod's tasks report its VM's host pid (QEMU's, as
// Kata reports its hypervisor's), through CRI and ctr, for the sandbox and
// its container; ctr task ps lists that pid alone. Killing it (what
// containerd's TestSandboxRemoveWithoutIPLeakage does) ends the pod's
// containers, and the pod then stops and is removed with nothing left.
func TestCRIHostPids(t *testing.T) {
	c := harness.StartCRI(t)
	pcfg := c.PodConfig("pids", nil)
	pod := c.RunPod(pcfg)
	app := c.StartContainer(pod, c.ContainerConfig("app", []string{"sleep", "inf"}, nil), pcfg)

	pid := inspectPid(t, c, "inspectp", pod)
	mustBeQEMU(t, c, "pod", pid)
	mustBeQEMU(t, c, "container", inspectPid(t, c, "inspect", app))
	for _, id := range []string{pod, app} {
		if p := ctrTaskPid(t, c.Env, id); p != pid {
			t.Fatalf("ctr task ls: task %s has pid %d, want the vm's %d", id, p, pid)
		}
	}
	ps := strings.Split(strings.TrimSpace(c.MustCtr("task", "ps", app)), "\n")
	if len(ps) != 2 || strings.Fields(ps[1])[0] != strconv.Itoa(pid) {
		t.Fatalf("ctr task ps = %q, want the vm's pid %d alone", ps, pid)
	}
	if out := c.MustCtr("task", "exec", "--exec-id", "x1", app, "sh", "-c", "echo exec-ok"); out != "exec-ok\n" {
		t.Fatalf("ctr task exec = %q", out)
	}

	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !harness.WaitFor(60*time.Second, func() bool {
		st, _, err := c.Crictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", app)
		return err == nil && strings.TrimSpace(st) == "CONTAINER_EXITED"
	}) {
		t.Fatalf("container still running 60s after its vm was killed\n%s", c.LogTail(30))
	}
	if !harness.WaitFor(30*time.Second, func() bool {
		st, _, err := c.Crictl("inspectp", "-o", "go-template", "--template", "{{.status.state}}", pod)
		return err == nil && strings.TrimSpace(st) == "SANDBOX_NOTREADY"
	}) {
		t.Fatalf("pod still ready 30s after its vm was killed\n%s", c.LogTail(30))
	}
	c.MustCrictl("stopp", pod)
	c.MustCrictl("rmp", pod)
	if !harness.WaitFor(20*time.Second, func() bool { return len(c.QEMUPids()) == 0 && len(c.ShimPids()) == 0 }) {
		t.Fatalf("after rmp: qemu %v shim %v", c.QEMUPids(), c.ShimPids())
	}
}

// TestCRIHostNetworkHostname: a host-network pod that sets its own
// hostname is refused, as runc refuses it (CRI gives such a pod no UTS
// namespace), before any VM boots; one without a hostname runs.
func TestCRIHostNetworkHostname(t *testing.T) {
	c := harness.StartCRI(t)
	hostNet := map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}}}
	out, errs, err := c.Crictl("runp", "--runtime", harness.RuntimeHandler, c.PodConfigLinux("default", "hostnet", nil, hostNet))
	if err == nil {
		t.Fatalf("runp of a host-network pod with a hostname succeeded: %s", out)
	}
	if !strings.Contains(errs, "uts namespace") || !strings.Contains(errs, "hostname") {
		t.Fatalf("runp error does not say why:\n%s", errs)
	}
	if q := c.QEMUPids(); len(q) != 0 {
		t.Fatalf("qemu %v runs for a refused pod", q)
	}
}

// TestCRIExecDrain: as with runc, ExecSync of a command that leaves a
// child holding its output fails once drain_exec_sync_io_timeout passes
// ("failed to drain exec process"), and succeeds, with the child's output,
// when the child ends within it; an ordinary exec ends at once. The drain
// timeout is 15 s so that an ordinary exec under the other lanes' load
// (1-2 s alone) tells apart from one that waited for it.
func TestCRIExecDrain(t *testing.T) {
	c := harness.StartCRIWith(t, &harness.CRI{DrainExecSyncIOTimeout: "15s"})
	pcfg := c.PodConfig("drain", nil)
	pod := c.RunPod(pcfg)
	app := c.StartContainer(pod, c.ContainerConfig("app", []string{"sleep", "inf"}, nil), pcfg)

	start := time.Now()
	if out := execOut(t, c, app, "echo", "prompt"); out != "prompt" {
		t.Fatalf("exec echo = %q", out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("an ordinary exec took %s: it must not wait for the drain timeout", d)
	}

	out, errs, err := c.Crictl("exec", "--sync", "--timeout", "60", app, "sh", "-c", "sleep 365d &")
	if err == nil || !strings.Contains(errs, "failed to drain exec process") {
		t.Fatalf("exec of a command that leaves its output held: %v\nstdout: %s\nstderr: %s", err, out, errs)
	}

	out, errs, err = c.Crictl("exec", "--sync", "--timeout", "60", app, "sh", "-c", "echo first; (sleep 2; echo late) &")
	if err != nil || strings.TrimSpace(out) != "first\nlate" {
		t.Fatalf("exec whose child ends within the drain timeout: %v\nstdout: %q (want first and late)\nstderr: %s", err, out, errs)
	}
}

// taskEvent is the part of a TaskExit or TaskDelete that ctr events shows.
type taskEvent struct {
	ContainerID string `json:"container_id"`
	ID          string `json:"id"`
	Pid         int    `json:"pid"`
	ExitStatus  int    `json:"exit_status"`
}

// find returns the first event of topic for container id.
func (l *eventLog) find(topic, id string) (taskEvent, bool) {
	for _, s := range l.all() {
		i := strings.Index(s, " "+topic+" ")
		if i < 0 {
			continue
		}
		var e taskEvent
		if json.Unmarshal([]byte(s[i+len(topic)+2:]), &e) == nil && e.ContainerID == id {
			return e, true
		}
	}
	return taskEvent{}, false
}

// TestCRIKillShimEventsCarryPid: when a pod's shim is killed, containerd
// runs `shim delete` for each task, and the TaskExit and TaskDelete it
// publishes carry the pid the task had (its VM's), with exit status 137,
// for the sandbox and for its container (containerd's
// TestKillShimPublishesTaskExitAndDeleteEvents(ForContainer)).
func TestCRIKillShimEventsCarryPid(t *testing.T) {
	c := harness.StartCRI(t)
	pcfg := c.PodConfig("killshim", nil)
	pod := c.RunPod(pcfg)
	app := c.StartContainer(pod, c.ContainerConfig("app", []string{"sleep", "inf"}, nil), pcfg)
	pid := inspectPid(t, c, "inspectp", pod)
	mustBeQEMU(t, c, "pod", pid)
	events := watchEvents(t, c.Env)
	shims := c.ShimPids()
	if len(shims) != 1 {
		t.Fatalf("shim pids %v, want one", shims)
	}
	if err := syscall.Kill(shims[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{pod, app} {
		for _, topic := range []string{"/tasks/exit", "/tasks/delete"} {
			var e taskEvent
			if !harness.WaitFor(30*time.Second, func() bool {
				var ok bool
				e, ok = events.find(topic, id)
				return ok
			}) {
				t.Fatalf("no %s for %s 30s after the shim was killed:\n%s", topic, id, strings.Join(events.all(), "\n"))
			}
			if e.Pid != pid || e.ExitStatus != 137 {
				t.Errorf("%s of %s: pid %d, status %d; want the vm's pid %d and 137", topic, id, e.Pid, e.ExitStatus, pid)
			}
		}
	}
	// CRI retries its handling of the container's exit (its first task
	// delete meets the dead shim), as containerd's own test waits for.
	if !harness.WaitFor(60*time.Second, func() bool {
		st, _, err := c.Crictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", app)
		return err == nil && strings.TrimSpace(st) == "CONTAINER_EXITED"
	}) {
		t.Fatalf("container still running 60s after its shim was killed\n%s", c.LogTail(30))
	}
	c.MustCrictl("stopp", pod)
	c.MustCrictl("rmp", pod)
	if !harness.WaitFor(20*time.Second, func() bool { return len(c.QEMUPids()) == 0 && len(c.ShimPids()) == 0 }) {
		t.Fatalf("after rmp: qemu %v shim %v", c.QEMUPids(), c.ShimPids())
	}
}
