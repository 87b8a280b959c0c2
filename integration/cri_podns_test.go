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
// (the sandbox container's) and one /dev/shm, while each keeps its own pid
// namespace. A sysctl the guest kernel does not have fails RunPodSandbox,
// naming it, and leaves no VM behind.
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
	if pa, pb := nsOf(t, c, a, "pid"), nsOf(t, c, b, "pid"); pa == pb {
		t.Errorf("pid namespaces of the pod's containers: both %q, want one each (the pod does not share them)", pa)
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
