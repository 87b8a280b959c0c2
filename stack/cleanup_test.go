package stack

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// removeCgroups kills what is left in a stack's cgroup root (a runc
// container whose shim was killed) and removes the root from every
// hierarchy, nested cgroups first.
func TestRemoveCgroups(t *testing.T) {
	pids := filepath.Join(cgroupFS, "pids")
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups")
	}
	if _, err := os.Stat(filepath.Join(pids, "cgroup.procs")); err != nil {
		t.Skip("no cgroup v1 pids hierarchy")
	}
	root := fmt.Sprintf("/cryo-it-cgtest-%d", os.Getpid())
	nested := filepath.Join(pids, root, "pod", "ctr")
	if err := os.MkdirAll(nested, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroups(root) })
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if err := os.WriteFile(filepath.Join(nested, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		_ = cmd.Process.Kill()
		t.Fatal(err)
	}

	killed := removeCgroups(root)
	if !slices.Contains(killed, cmd.Process.Pid) {
		_ = cmd.Process.Kill()
		t.Errorf("killed %v, want the sleep %d left in the cgroup", killed, cmd.Process.Pid)
	}
	<-done
	if _, err := os.Stat(filepath.Join(pids, root)); !os.IsNotExist(err) {
		t.Fatalf("cgroup %s still there: %v", root, err)
	}
	if got := removeCgroups("/cryo-it-none-such"); len(got) != 0 {
		t.Fatalf("a missing root: killed %v", got)
	}
}
