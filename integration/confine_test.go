//go:build integration

package integration

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/vmm"
)

// confinedQEMUs checks that there are want QEMUs and that each runs under
// its seccomp filter (Seccomp: 2) as an unprivileged uid no other has.
func confinedQEMUs(t *testing.T, what string, pids []int, want int) {
	t.Helper()
	if len(pids) != want {
		t.Fatalf("%s: %d QEMU processes, want %d", what, len(pids), want)
	}
	uids := map[int]int{}
	for _, pid := range pids {
		uid, mode, err := vmm.ProcessConfinement(pid)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if uid == 0 || mode != 2 {
			t.Errorf("%s: qemu %d has uid %d and seccomp mode %d, want a non-zero uid and 2", what, pid, uid, mode)
		}
		if other, dup := uids[uid]; dup {
			t.Errorf("%s: qemu %d and %d share uid %d", what, pid, other, uid)
		}
		uids[uid] = pid
	}
}

// TestQEMUConfined: the QEMU of a running pod, of a pod with a hot-plugged
// container disk, and of a pod restored from a checkpoint runs confined,
// and each feature still works so.
func TestQEMUConfined(t *testing.T) {
	c := harness.StartCRI(t)
	store := c.StoreURL("confined:v1")
	srcCfg := c.PodConfig("src", map[string]string{"cryo.dev/checkpoint-to": store})
	src := c.RunPod(srcCfg)
	confinedQEMUs(t, "running pod", c.QEMUPids(), 1)

	// The container's root disk is hot-plugged into the running VM.
	app := c.StartContainer(src, c.ContainerConfig("app", []string{"sh", "-c", "echo on-hotplugged-disk > /mark; " + criWorkload}, nil), srcCfg)
	if !harness.WaitFor(60*time.Second, func() bool {
		o, _, err := c.Crictl("exec", app, "cat", "/mark", "/dev/shm/counter")
		return err == nil && strings.HasPrefix(o, "on-hotplugged-disk\n")
	}) {
		t.Fatal("container on a hot-plugged disk did not write its root file system")
	}
	confinedQEMUs(t, "hot-plugged pod", c.QEMUPids(), 1)
	secret := execOut(t, c, app, "cat", "/dev/shm/secret")

	c.MustCrictl("checkpoint", "--export="+filepath.Join(c.Dir, "confined.tar"), app)
	if got := execOut(t, c, app, "cat", "/mark"); got != "on-hotplugged-disk" {
		t.Fatalf("source after checkpoint reads %q from its disk", got)
	}

	dstCfg := c.PodConfig("dst", map[string]string{"cryo.dev/restore-from": store})
	dst := c.RunPod(dstCfg)
	dapp := c.StartContainer(dst, c.ContainerConfig("app", []string{"sh", "-c", "echo this-never-runs"}, nil), dstCfg)
	if got := execOut(t, c, dapp, "sh", "-c", "cat /dev/shm/secret; echo; cat /mark"); secret == "" || got != secret+"\non-hotplugged-disk" {
		t.Fatalf("restored pod reads %q, want its RAM secret %s and its disk's mark", got, secret)
	}
	execOut(t, c, dapp, "sh", "-c", "echo after-restore > /mark2")
	confinedQEMUs(t, "source and restored pods", c.QEMUPids(), 2)

	for _, p := range []string{src, dst} {
		c.MustCrictl("stopp", p)
		c.MustCrictl("rmp", p)
	}
	if !harness.WaitFor(20*time.Second, func() bool { return len(c.QEMUPids()) == 0 }) {
		t.Fatalf("QEMU left after rmp: %v", c.QEMUPids())
	}
}
