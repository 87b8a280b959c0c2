//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestCRICheckpointNoStore: a kubelet-style checkpoint (CRI
// CheckpointContainer) of a pod that names no store, on a node without
// [stores] default_checkpoint_to, is refused before the VM is touched,
// with an error that says what to set; the pod runs on and no archive is
// written.
func TestCRICheckpointNoStore(t *testing.T) {
	c := harness.StartCRI(t)
	pcfg := c.PodConfig("nostore", nil)
	pod := c.RunPod(pcfg)
	app := c.StartContainer(pod, c.ContainerConfig("app", []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /dev/shm/n.new; mv /dev/shm/n.new /dev/shm/n; sleep 0.1; done"}, nil), pcfg)
	counter := func() int {
		n, _ := strconv.Atoi(execOut(t, c, app, "cat", "/dev/shm/n"))
		return n
	}
	if !harness.WaitFor(60*time.Second, func() bool { return counter() > 0 }) {
		t.Fatal("workload not counting")
	}
	export := filepath.Join(c.Dir, "nostore.tar")
	out, errs, err := c.Crictl("checkpoint", "--export="+export, app)
	if err == nil {
		t.Fatalf("checkpoint without a store succeeded: %s", out)
	}
	for _, want := range []string{"cryo.dev/checkpoint-to", "default_checkpoint_to"} {
		if !strings.Contains(errs, want) {
			t.Fatalf("checkpoint error does not name %s:\n%s", want, errs)
		}
	}
	if strings.Contains(errs, "not a directory") {
		t.Fatalf("checkpoint reached containerd's copy of the checkpoint path:\n%s", errs)
	}
	if st, err := os.Stat(export); err == nil && st.Size() > 0 {
		t.Fatalf("a refused checkpoint left an archive of %d bytes", st.Size())
	}
	// The pod runs on, not paused.
	n := counter()
	if !harness.WaitFor(10*time.Second, func() bool { return counter() > n }) {
		t.Fatalf("the pod stopped counting after a refused checkpoint")
	}
}
