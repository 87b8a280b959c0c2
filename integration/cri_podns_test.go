//go:build integration

package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestCRIPodNamespaces: a pod's containers share what they share under
// runc. The pod's sysctls (namespaced: IPC, mqueue, net) are set where its
// containers read them; its containers share one IPC and one UTS namespace
// (the sandbox container's) and one /dev/shm, and, as crictl's configs
// leave the pid namespace mode at CRI's default (POD, shareProcessNamespace
// under Kubernetes), one pid namespace. A sysctl the guest kernel does not
// have fails RunPodSandbox, naming it, and leaves no VM behind. The pid
// namespaces of a pod that does not share them: TestCRIDebugTarget.
func TestCRIPodNamespaces(t *testing.T) {
	c := harness.StartCRI(t)
	pcfg := c.PodConfigLinux("default", "podns", nil, map[string]any{"sysctls": map[string]string{
		"kernel.shm_rmid_forced":       "1",
		"fs.mqueue.msg_max":            "100",
		"net.ipv4.ip_local_port_range": "20000 30000",
	}})
	pod := c.RunPod(pcfg)
	a := c.StartContainer(pod, c.ContainerConfig("a", []string{"sleep", "inf"}, nil), pcfg)
	b := c.StartContainer(pod, c.ContainerConfig("b", []string{"sleep", "inf"}, nil), pcfg)

	for _, id := range []string{a, b} {
		for file, want := range map[string]string{
			"/proc/sys/kernel/shm_rmid_forced":       "1",
			"/proc/sys/fs/mqueue/msg_max":            "100",
			"/proc/sys/net/ipv4/ip_local_port_range": "20000\t30000",
		} {
			if got := execOut(t, c, id, "cat", file); got != want {
				t.Errorf("container %s: %s = %q, want %q (the pod's sysctl)", id, file, got, want)
			}
		}
		if got := execOut(t, c, id, "hostname"); got != "podns" {
			t.Errorf("container %s: hostname %q, want the pod's, podns", id, got)
		}
	}
	for _, ns := range []string{"ipc", "uts"} {
		na, nb := nsOf(t, c, a, ns), nsOf(t, c, b, ns)
		if na == "" || na != nb {
			t.Errorf("%s namespaces of the pod's containers: %q and %q, want one", ns, na, nb)
		}
	}
	if pa, pb := nsOf(t, c, a, "pid"), nsOf(t, c, b, "pid"); pa != pb {
		t.Errorf("pid namespaces of the pod's containers: %q and %q, want one (CRI's POD mode)", pa, pb)
	}
	// The harness's pause image runs `sleep inf` too: the sandbox's, a's
	// and b's.
	if ps := execOut(t, c, b, "ps"); strings.Count(ps, "sleep inf") != 3 {
		t.Errorf("b's ps shows %d `sleep inf`, want the sandbox's, a's and its own:\n%s", strings.Count(ps, "sleep inf"), ps)
	}
	// A container whose init is not PID 1 of its pid namespace ends with
	// its init, as under runc: its background sleep 1003 goes too (the
	// agent kills it before the exit is reported, TestAgentVM; containerd
	// deletes an exited container's task, which would kill it a moment
	// later).
	ends := c.StartContainer(pod, c.ContainerConfig("ends", []string{"sh", "-c", "sleep 1003 & while [ ! -e /dev/shm/end ]; do sleep 0.1; done; exit 3"}, nil), pcfg)
	if !harness.WaitFor(30*time.Second, func() bool { return strings.Contains(execOut(t, c, b, "ps"), "sleep 1003") }) {
		t.Fatalf("b's ps never shows the sleep 1003 of container ends:\n%s", execOut(t, c, b, "ps"))
	}
	c.MustCrictl("exec", b, "touch", "/dev/shm/end")
	if !harness.WaitFor(60*time.Second, func() bool {
		st, _, err := c.Crictl("inspect", "-o", "go-template", "--template", "{{.status.state}} {{.status.exitCode}}", ends)
		return err == nil && strings.TrimSpace(st) == "CONTAINER_EXITED 3"
	}) {
		t.Fatalf("container ends did not exit 3 once told to\n%s", c.LogTail(30))
	}
	if ps := execOut(t, c, b, "ps"); strings.Contains(ps, "sleep 1003") {
		t.Errorf("the background sleep 1003 of container ends outlived its init:\n%s", ps)
	}
	c.MustCrictl("exec", a, "sh", "-c", "echo from-a > /dev/shm/note")
	if got := execOut(t, c, b, "cat", "/dev/shm/note"); got != "from-a" {
		t.Errorf("b reads %q from /dev/shm/note that a wrote, want from-a (one /dev/shm per pod)", got)
	}
	// A container of another pod shares none of it.
	ocfg := c.PodConfig("other", nil)
	other := c.StartContainer(c.RunPod(ocfg), c.ContainerConfig("o", []string{"sleep", "inf"}, nil), ocfg)
	if got := execOut(t, c, other, "cat", "/proc/sys/kernel/shm_rmid_forced"); got != "0" {
		t.Errorf("another pod's kernel.shm_rmid_forced = %q, want the default 0", got)
	}
	if out, _, _ := c.Crictl("exec", other, "cat", "/dev/shm/note"); strings.Contains(out, "from-a") {
		t.Error("another pod reads this pod's /dev/shm")
	}
	if n := len(c.QEMUPids()); n != 2 {
		t.Fatalf("%d QEMU processes for two pods, want 2", n)
	}

	bad := c.PodConfigLinux("default", "badsysctl", nil, map[string]any{"sysctls": map[string]string{"kernel.no_such_sysctl": "1"}})
	_, errs, err := c.Crictl("runp", "--runtime", harness.RuntimeHandler, bad)
	if err == nil || !strings.Contains(errs, "linux.sysctl") || !strings.Contains(errs, "no_such_sysctl") {
		t.Fatalf("runp with sysctl kernel.no_such_sysctl: %v %q; want a refusal naming linux.sysctl and the sysctl", err, errs)
	}
	if !harness.WaitFor(30*time.Second, func() bool { return len(c.QEMUPids()) == 2 }) {
		t.Fatalf("%d QEMU processes after the refused pod, want the 2 of the running pods", len(c.QEMUPids()))
	}
}

// nsOf is the namespace of type ns (ipc:[4026532123]) that a process
// exec'd in container id is in (busybox has ls, not readlink).
func nsOf(t *testing.T, c *harness.CRI, id, ns string) string {
	t.Helper()
	out := execOut(t, c, id, "ls", "-l", "/proc/self/ns/"+ns)
	_, link, ok := strings.Cut(out, " -> ")
	if !ok || !strings.HasPrefix(link, ns+":[") {
		t.Fatalf("ls -l /proc/self/ns/%s in %s: %q", ns, id, out)
	}
	return link
}

// TestCRIDebugTarget: in a pod whose containers have their own pid
// namespaces (CONTAINER, what the kubelet asks for a pod that does not set
// shareProcessNamespace), a debug container that targets one (TARGET,
// kubectl debug --target) is in that one's pid namespace and sees its
// processes, as under runc; the pod's containers keep theirs.
func TestCRIDebugTarget(t *testing.T) {
	c := harness.StartCRI(t)
	own := map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"pid": 1}}}
	pcfg := c.PodConfigLinux("default", "debugged", nil, own)
	pod := c.RunPod(pcfg)
	app := c.StartContainer(pod, c.ContainerConfig("app", []string{"sleep", "1001"}, map[string]any{"linux": own}), pcfg)
	side := c.StartContainer(pod, c.ContainerConfig("side", []string{"sleep", "1002"}, map[string]any{"linux": own}), pcfg)
	target := map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"pid": 3, "target_id": app}}}
	dbg := c.StartContainer(pod, c.ContainerConfig("dbg", []string{"sleep", "inf"}, map[string]any{"linux": target}), pcfg)

	pApp, pSide, pDbg := nsOf(t, c, app, "pid"), nsOf(t, c, side, "pid"), nsOf(t, c, dbg, "pid")
	if pApp == pSide {
		t.Errorf("app and side share pid namespace %s, want one each (CONTAINER)", pApp)
	}
	if pDbg != pApp {
		t.Errorf("the debug container's pid namespace %s, want its target's %s", pDbg, pApp)
	}
	ps := execOut(t, c, dbg, "ps")
	if !strings.Contains(ps, "sleep 1001") || strings.Contains(ps, "sleep 1002") {
		t.Errorf("the debug container's ps, want app's sleep 1001 and not side's sleep 1002:\n%s", ps)
	}
	if out := execOut(t, c, app, "cat", "/proc/1/cmdline"); !strings.HasPrefix(out, "sleep") {
		t.Errorf("app's pid 1 runs %q, want its own sleep (PID 1 of its namespace)", out)
	}
}
